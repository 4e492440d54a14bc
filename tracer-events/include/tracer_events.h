/*
 * tracer_events.h: what a C or C++ program says about itself, in the trace `tracer` records of it.
 *
 * Header only; needs nothing but a C99 (or C++11) compiler. Each event becomes an event in the
 * same time-ordered trace as the program's function calls, spawns and messages:
 *
 *     #include "tracer_events.h"
 *
 *     tracer_events_print("Another message");
 *     tracer_events_print_with_data("{\"count\": 42}", "batch done");      // data: JSON text
 *     tracer_events_printf("Count is: %d", count);
 *     tracer_events_log(TRACER_EVENTS_WARN, "net", NULL, "slow client");   // a logger's record
 *     if (tracer_events_enabled()) { ... something only the trace needs ... }
 *
 * Each is a USDT probe (`tracer_events:event`, an ELF note in `.note.stapsdt`) with a semaphore:
 * a counter in `.probes` that the kernel raises while a tracer is attached. Until then a call
 * costs one load and compare: its arguments are not even evaluated, nothing is formatted. The
 * file, line and function of each event are the caller's (__FILE__, __LINE__, __func__).
 *
 * What the probe receives is the payload encoding of the Rust crate `tracer-events`
 * (`tracer_events::payload`, version 1): a header (version, kind, level, field count, line)
 * and six length-prefixed fields (source, function, file, spans, message, data). The tracer keeps
 * at most 4096 bytes of one event; a longer one arrives cut, and marked as cut.
 *
 * The probe instruction is a 5-byte nop, which Linux turns into a call to its uprobe trampoline
 * rather than a breakpoint trap (much cheaper while traced). That call pushes a return address,
 * so the stack pointer is first moved past the 128-byte red zone, where the compiler may keep
 * live data, and moved back after.
 *
 * On anything but x86-64 Linux every call compiles to nothing.
 */
#ifndef TRACER_EVENTS_H
#define TRACER_EVENTS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Levels, as the payload encodes them. */
enum tracer_events_level {
	TRACER_EVENTS_TRACE = 1,
	TRACER_EVENTS_DEBUG = 2,
	TRACER_EVENTS_INFO = 3,
	TRACER_EVENTS_WARN = 4,
	TRACER_EVENTS_ERROR = 5
};

/* Kinds: a logger's record, or a print. */
enum tracer_events_kind { TRACER_EVENTS_KIND_LOG = 1, TRACER_EVENTS_KIND_TRACE = 2 };

#if defined(__x86_64__) && defined(__linux__)

/* The semaphore: one per executable or library (weak, so every file that includes this header
 * shares it; hidden, so a library's is its own). In `.probes`, which is file-backed data, since
 * the kernel can only bump a counter it finds in the file. */
__attribute__((weak, visibility("hidden"), section(".probes"))) volatile unsigned short tracer_events_semaphore;

/* Whether a tracer is attached. */
#define tracer_events_enabled() (__builtin_expect(tracer_events_semaphore != 0, 0))

/* Fires the probe with one encoded payload. Out of line, so that each file has one probe site. */
static __attribute__((noinline, unused)) void tracer_events__fire(const void *payload, size_t len)
{
	__asm__ __volatile__(
		"lea -128(%%rsp), %%rsp\n"
		"990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
		"lea 128(%%rsp), %%rsp\n"
		".pushsection .note.stapsdt, \"\", \"note\"\n"
		".balign 4\n"
		".4byte 992f-991f, 994f-993f, 3\n"
		"991: .asciz \"stapsdt\"\n"
		"992: .balign 4\n"
		"993: .8byte 990b\n"
		".8byte _.stapsdt.base\n"
		".8byte tracer_events_semaphore\n"
		".asciz \"tracer_events\"\n"
		".asciz \"event\"\n"
		".asciz \"8@%0 8@%1\"\n"
		"994: .balign 4\n"
		".popsection\n"
		".ifndef _.stapsdt.base\n"
		".pushsection .stapsdt.base, \"aGR\", \"progbits\", .stapsdt.base, comdat\n"
		".weak _.stapsdt.base\n"
		".hidden _.stapsdt.base\n"
		"_.stapsdt.base: .space 1\n"
		".size _.stapsdt.base, 1\n"
		".popsection\n"
		".endif\n"
		:
		: "r"(payload), "r"(len)
		: "memory");
}

#else /* not x86-64 Linux: no probes */

#define tracer_events_enabled() 0

static __attribute__((unused)) void tracer_events__fire(const void *payload, size_t len)
{
	(void)payload;
	(void)len;
}

#endif

static inline unsigned char *tracer_events__field(unsigned char *at, const char *text, size_t len)
{
	uint32_t n = (uint32_t)len;
	at[0] = (unsigned char)n;
	at[1] = (unsigned char)(n >> 8);
	at[2] = (unsigned char)(n >> 16);
	at[3] = (unsigned char)(n >> 24);
	if (len)
		memcpy(at + 4, text, len);
	return at + 4 + len;
}

/* Encodes one event (NULL strings are empty) and fires the probe. Called only while a tracer
 * listens, through the macros below. */
static __attribute__((unused)) void tracer_events__emit(int kind, int level, const char *source,
							const char *function, const char *file,
							unsigned line, const char *message,
							const char *data_json)
{
	const char *texts[6] = { source, function, file, NULL, message, data_json };
	size_t lens[6];
	size_t total = 8;
	unsigned char small[1024];
	unsigned char *buf, *at;
	int i;

	for (i = 0; i < 6; i++) {
		lens[i] = texts[i] ? strlen(texts[i]) : 0;
		if (lens[i] > 0xffffffffu)
			lens[i] = 0xffffffffu;
		total += 4 + lens[i];
	}
	buf = total <= sizeof(small) ? small : (unsigned char *)malloc(total);
	if (!buf)
		return;
	buf[0] = 1; /* version */
	buf[1] = (unsigned char)kind;
	buf[2] = (unsigned char)level;
	buf[3] = 6; /* fields */
	buf[4] = (unsigned char)line;
	buf[5] = (unsigned char)(line >> 8);
	buf[6] = (unsigned char)(line >> 16);
	buf[7] = (unsigned char)(line >> 24);
	at = buf + 8;
	for (i = 0; i < 6; i++)
		at = tracer_events__field(at, texts[i], lens[i]);
	tracer_events__fire(buf, total);
	if (buf != small)
		free(buf);
}

/* Formats the message like printf, then emits it. */
static __attribute__((unused, format(printf, 7, 8))) void
tracer_events__emitf(int kind, int level, const char *source, const char *function, const char *file,
		     unsigned line, const char *format, ...)
{
	char small[512];
	char *message = small;
	va_list args;
	int n;

	va_start(args, format);
	n = vsnprintf(small, sizeof(small), format, args);
	va_end(args);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(small)) {
		message = (char *)malloc((size_t)n + 1);
		if (!message)
			return;
		va_start(args, format);
		vsnprintf(message, (size_t)n + 1, format, args);
		va_end(args);
	}
	tracer_events__emit(kind, level, source, function, file, line, message, NULL);
	if (message != small)
		free(message);
}

/* An event with this message (type `trace`, level `info`). */
#define tracer_events_print(message)                                                              \
	do {                                                                                      \
		if (tracer_events_enabled())                                                      \
			tracer_events__emit(TRACER_EVENTS_KIND_TRACE, TRACER_EVENTS_INFO, NULL,   \
					    __func__, __FILE__, __LINE__, (message), NULL);       \
	} while (0)

/* An event with this message and data, given as JSON text (e.g. "{\"count\": 3}"). */
#define tracer_events_print_with_data(data_json, message)                                         \
	do {                                                                                      \
		if (tracer_events_enabled())                                                      \
			tracer_events__emit(TRACER_EVENTS_KIND_TRACE, TRACER_EVENTS_INFO, NULL,   \
					    __func__, __FILE__, __LINE__, (message), (data_json)); \
	} while (0)

/* An event whose message is formatted like printf. */
#define tracer_events_printf(...)                                                                 \
	do {                                                                                      \
		if (tracer_events_enabled())                                                      \
			tracer_events__emitf(TRACER_EVENTS_KIND_TRACE, TRACER_EVENTS_INFO, NULL,  \
					     __func__, __FILE__, __LINE__, __VA_ARGS__);          \
	} while (0)

/* A logger's record: a level, the logger's name (source, may be NULL), data as JSON text (may be
 * NULL) and the message. */
#define tracer_events_log(level, source, data_json, message)                                      \
	do {                                                                                      \
		if (tracer_events_enabled())                                                      \
			tracer_events__emit(TRACER_EVENTS_KIND_LOG, (level), (source), __func__,  \
					    __FILE__, __LINE__, (message), (data_json));          \
	} while (0)

#ifdef __cplusplus
}
#endif

#endif /* TRACER_EVENTS_H */
