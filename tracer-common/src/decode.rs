//! Safe decoding of ring-buffer records (user space only).

use core::{fmt, mem::size_of};

use crate::{
    CAPTURE_BYTES_MAX, CallRecord, ExecRecord, ExitRecord, ForkRecord, GoCallRecord, GoReturnRecord, IpcRecord,
    RecordHeader, RecordKind, ReturnRecord, SignalRecord, USDT_MAX_ARGS, USER_EVENT_PAYLOAD_MAX, UsdtRecord,
    UserEventRecord, WatchRecord,
};

/// One record, copied out of the ring buffer (a program event's payload stays where it was read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// The record and the bytes after it: the strings its probe read (see [`crate::strings`]),
    /// parsed by user space against the function's layout.
    Call(CallRecord, &'a [u8]),
    Return(ReturnRecord, &'a [u8]),
    Fork(ForkRecord),
    Exec(ExecRecord),
    Exit(ExitRecord),
    /// The record and the payload bytes captured after it (`captured_len` of them).
    Ipc(IpcRecord, &'a [u8]),
    Signal(SignalRecord),
    GoCall(GoCallRecord),
    GoReturn(GoReturnRecord),
    /// The record and the payload bytes that followed it (`copied_len` of them).
    UserEvent(UserEventRecord, &'a [u8]),
    Usdt(UsdtRecord),
    /// A breakpoint's locals, in a USDT record's layout, and the bytes after it: the strings its
    /// spec read (see [`crate::strings`]).
    Break(UsdtRecord, &'a [u8]),
    Watch(WatchRecord),
}

impl Record<'_> {
    pub fn header(&self) -> &RecordHeader {
        match self {
            Record::Call(r, _) => &r.header,
            Record::Return(r, _) => &r.header,
            Record::Fork(r) => &r.header,
            Record::Exec(r) => &r.header,
            Record::Exit(r) => &r.header,
            Record::Ipc(r, _) => &r.header,
            Record::Signal(r) => &r.header,
            Record::GoCall(r) => &r.header,
            Record::GoReturn(r) => &r.header,
            Record::UserEvent(r, _) => &r.header,
            Record::Usdt(r) => &r.header,
            Record::Break(r, _) => &r.header,
            Record::Watch(r) => &r.header,
        }
    }
}

/// Why a record could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than a header.
    TooShort { len: usize },
    /// The header's kind is not one this build knows.
    UnknownKind { kind: u32 },
    /// Fewer bytes than the record its kind names.
    Truncated { kind: RecordKind, len: usize, expected: usize },
    /// A program event says more payload bytes follow than the kernel copies or than are there.
    BadPayloadLength { copied_len: u32, available: usize },
    /// A USDT record claims more arguments than a probe can have.
    BadArgCount { arg_count: u32 },
    /// An IPC record says more payload bytes follow than the kernel captures or than are there.
    BadCaptureLength { captured_len: u32, available: usize },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooShort { len } => {
                write!(f, "record of {len} bytes is shorter than a header ({} bytes)", size_of::<RecordHeader>())
            }
            DecodeError::UnknownKind { kind } => write!(f, "record has unknown kind {kind}"),
            DecodeError::Truncated { kind, len, expected } => {
                write!(f, "{kind:?} record of {len} bytes is truncated (expected {expected})")
            }
            DecodeError::BadPayloadLength { copied_len, available } => write!(
                f,
                "program event claims {copied_len} payload bytes, {available} follow (at most {USER_EVENT_PAYLOAD_MAX})"
            ),
            DecodeError::BadCaptureLength { captured_len, available } => write!(
                f,
                "IPC record claims {captured_len} captured payload bytes, {available} follow (at most {CAPTURE_BYTES_MAX})"
            ),
            DecodeError::BadArgCount { arg_count } => {
                write!(f, "USDT record claims {arg_count} arguments (at most {USDT_MAX_ARGS})")
            }
        }
    }
}

impl core::error::Error for DecodeError {}

/// Reads a `T` from the start of `bytes` after checking the length.
fn read<T: Copy>(kind: RecordKind, bytes: &[u8]) -> Result<T, DecodeError> {
    let expected = size_of::<T>();
    if bytes.len() < expected {
        return Err(DecodeError::Truncated { kind, len: bytes.len(), expected });
    }
    // SAFETY: the length was checked above; `T` is one of this crate's `#[repr(C)]` integer-only
    // records, valid for any bit pattern; `read_unaligned` makes no alignment assumption.
    Ok(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Decodes one ring-buffer record. Longer records than expected are accepted (a newer kernel
/// side may append fields; a program event's payload is exactly the `copied_len` bytes after its
/// record); shorter ones and unknown kinds are errors.
pub fn decode(bytes: &[u8]) -> Result<Record<'_>, DecodeError> {
    if bytes.len() < size_of::<RecordHeader>() {
        return Err(DecodeError::TooShort { len: bytes.len() });
    }
    let raw_kind = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let kind = RecordKind::try_from(raw_kind).map_err(|kind| DecodeError::UnknownKind { kind })?;
    Ok(match kind {
        RecordKind::Call => Record::Call(read(kind, bytes)?, &bytes[size_of::<CallRecord>()..]),
        RecordKind::Return => Record::Return(read(kind, bytes)?, &bytes[size_of::<ReturnRecord>()..]),
        RecordKind::Fork => Record::Fork(read(kind, bytes)?),
        RecordKind::Exec => Record::Exec(read(kind, bytes)?),
        RecordKind::Exit => Record::Exit(read(kind, bytes)?),
        RecordKind::Ipc => {
            let record: IpcRecord = read(kind, bytes)?;
            let rest = &bytes[size_of::<IpcRecord>()..];
            let captured = record.captured_len as usize;
            if captured > CAPTURE_BYTES_MAX || captured > rest.len() {
                return Err(DecodeError::BadCaptureLength { captured_len: record.captured_len, available: rest.len() });
            }
            Record::Ipc(record, &rest[..captured])
        }
        RecordKind::Signal => Record::Signal(read(kind, bytes)?),
        RecordKind::GoCall => Record::GoCall(read(kind, bytes)?),
        RecordKind::GoReturn => Record::GoReturn(read(kind, bytes)?),
        RecordKind::UserEvent => {
            let record: UserEventRecord = read(kind, bytes)?;
            let rest = &bytes[size_of::<UserEventRecord>()..];
            let copied = record.copied_len as usize;
            if copied > USER_EVENT_PAYLOAD_MAX || copied > rest.len() {
                return Err(DecodeError::BadPayloadLength { copied_len: record.copied_len, available: rest.len() });
            }
            Record::UserEvent(record, &rest[..copied])
        }
        RecordKind::Usdt => {
            let record: UsdtRecord = read(kind, bytes)?;
            if record.arg_count as usize > USDT_MAX_ARGS {
                return Err(DecodeError::BadArgCount { arg_count: record.arg_count });
            }
            Record::Usdt(record)
        }
        RecordKind::Break => {
            let record: UsdtRecord = read(kind, bytes)?;
            if record.arg_count as usize > USDT_MAX_ARGS {
                return Err(DecodeError::BadArgCount { arg_count: record.arg_count });
            }
            Record::Break(record, &bytes[size_of::<UsdtRecord>()..])
        }
        RecordKind::Watch => Record::Watch(read(kind, bytes)?),
    })
}

/// The bytes of a NUL-terminated kernel string field, without the NUL (all of it if there is none).
pub fn c_bytes(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::COMM_LEN;

    fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: test helper over the crate's padding-free integer records.
        unsafe { core::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn header(kind: RecordKind) -> RecordHeader {
        RecordHeader { kind: kind as u32, _pad: 0, ts_boot_ns: 123, pid: 10, tid: 11 }
    }

    #[test]
    fn decodes_each_kind() {
        let call = CallRecord { header: header(RecordKind::Call), cookie: 7, args: [1, 2, 3, 4, 5, 6], sp: 8 };
        assert_eq!(decode(&bytes_of(&call)), Ok(Record::Call(call, &[])));
        let ret = ReturnRecord { header: header(RecordKind::Return), cookie: 7, retval: 42, rdx: 3, sp: 8 };
        assert_eq!(decode(&bytes_of(&ret)), Ok(Record::Return(ret, &[])));
        let fork = ForkRecord {
            header: header(RecordKind::Fork),
            child_pid: 12,
            child_tid: 12,
            is_thread: 0,
            followed: 1,
            comm: [b'a'; COMM_LEN],
        };
        assert_eq!(decode(&bytes_of(&fork)), Ok(Record::Fork(fork)));
        let exit = ExitRecord { header: header(RecordKind::Exit), exit_code: 3 << 8, group_dead: 1, comm: [0; 16] };
        assert_eq!(decode(&bytes_of(&exit)).map(|r| *r.header()), Ok(exit.header));
        let signal = SignalRecord {
            header: header(RecordKind::Signal),
            signal: 10,
            delivered: 1,
            target_pid: 3,
            target_tid: 4,
            code: 0,
            si_pid: 2,
            group: 1,
            result: 0,
        };
        assert_eq!(decode(&bytes_of(&signal)), Ok(Record::Signal(signal)));
        // SAFETY: an all-zero IpcRecord is a valid value (integers and arrays only).
        let mut ipc: IpcRecord = unsafe { core::mem::zeroed() };
        ipc.header = header(RecordKind::Ipc);
        ipc.bytes = 100;
        assert_eq!(decode(&bytes_of(&ipc)), Ok(Record::Ipc(ipc, &[])));
        // Captured payload bytes follow the record, exactly `captured_len` of them.
        ipc.captured_len = 3;
        ipc.capturing = 1;
        let mut with_payload = bytes_of(&ipc);
        with_payload.extend_from_slice(b"GET!");
        assert_eq!(decode(&with_payload), Ok(Record::Ipc(ipc, b"GET")));
        with_payload.truncate(size_of::<IpcRecord>() + 2);
        assert_eq!(decode(&with_payload), Err(DecodeError::BadCaptureLength { captured_len: 3, available: 2 }));
        ipc.captured_len = CAPTURE_BYTES_MAX as u32 + 1;
        let mut huge = bytes_of(&ipc);
        huge.resize(huge.len() + CAPTURE_BYTES_MAX + 1, 0);
        assert!(matches!(decode(&huge), Err(DecodeError::BadCaptureLength { .. })));
        let go_call = GoCallRecord {
            header: header(RecordKind::GoCall),
            cookie: crate::cookie::go(3, false, 152),
            goid: 18,
            stack_depth: 4096,
            args: [1, 2, 3, 4, 5, 6, 7, 8, 9],
        };
        assert_eq!(decode(&bytes_of(&go_call)), Ok(Record::GoCall(go_call)));
        let go_ret = GoReturnRecord {
            header: header(RecordKind::GoReturn),
            cookie: crate::cookie::go(3, true, 152),
            goid: 18,
            stack_depth: 4096,
            retval: 45,
        };
        assert_eq!(decode(&bytes_of(&go_ret)), Ok(Record::GoReturn(go_ret)));
    }

    #[test]
    fn cookies_carry_function_and_go_flags() {
        use crate::cookie;
        let c = cookie::go(0xdead_beef, true, 160);
        assert_eq!(cookie::function(c), 0xdead_beef);
        assert!(cookie::is_go(c) && cookie::is_go_return(c));
        assert_eq!(cookie::goid_offset(c), 160);
        let c = cookie::go(7, false, 152);
        assert!(cookie::is_go(c) && !cookie::is_go_return(c));
        let c = cookie::plain(7);
        assert_eq!(cookie::function(c), 7);
        assert!(!cookie::is_go(c) && !cookie::is_go_return(c));
    }

    #[test]
    fn program_events_carry_their_payload() {
        let record = UserEventRecord {
            header: header(RecordKind::UserEvent),
            cookie: 3,
            payload_len: 5,
            copied_len: 5,
            flags: 0,
        };
        let mut bytes = bytes_of(&record);
        bytes.extend_from_slice(b"hello");
        assert_eq!(decode(&bytes), Ok(Record::UserEvent(record, b"hello")));
        // The payload is what `copied_len` says, not whatever padding follows it.
        bytes.extend_from_slice(&[0; 3]);
        assert_eq!(decode(&bytes), Ok(Record::UserEvent(record, b"hello")));
        // Fewer bytes than claimed, or more than the kernel ever copies.
        assert_eq!(
            decode(&bytes[..bytes.len() - 4]),
            Err(DecodeError::BadPayloadLength { copied_len: 5, available: 4 })
        );
        let huge = UserEventRecord { copied_len: USER_EVENT_PAYLOAD_MAX as u32 + 1, ..record };
        let mut bytes = bytes_of(&huge);
        bytes.resize(bytes.len() + USER_EVENT_PAYLOAD_MAX + 1, 0);
        assert!(matches!(decode(&bytes), Err(DecodeError::BadPayloadLength { .. })));
    }

    #[test]
    fn usdt_records_have_at_most_twelve_arguments() {
        let mut record =
            UsdtRecord { header: header(RecordKind::Usdt), cookie: 1, arg_count: 2, failed_args: 0, args: [0; 12] };
        record.args[..2].copy_from_slice(&[7, u64::MAX]);
        assert_eq!(decode(&bytes_of(&record)), Ok(Record::Usdt(record)));
        record.arg_count = 13;
        assert_eq!(decode(&bytes_of(&record)), Err(DecodeError::BadArgCount { arg_count: 13 }));
    }

    #[test]
    fn accepts_longer_records() {
        let ret = ReturnRecord { header: header(RecordKind::Return), cookie: 1, retval: 2, rdx: 0, sp: 0 };
        let mut bytes = bytes_of(&ret);
        bytes.extend_from_slice(&[0xff; 8]);
        assert_eq!(decode(&bytes), Ok(Record::Return(ret, &[0xff; 8])));
    }

    #[test]
    fn rejects_truncated_records() {
        let call = CallRecord { header: header(RecordKind::Call), cookie: 7, args: [0; 6], sp: 0 };
        let bytes = bytes_of(&call);
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Truncated { kind: RecordKind::Call, len: bytes.len() - 1, expected: bytes.len() })
        );
        assert_eq!(decode(&bytes[..10]), Err(DecodeError::TooShort { len: 10 }));
        assert_eq!(decode(&[]), Err(DecodeError::TooShort { len: 0 }));
    }

    #[test]
    fn rejects_unknown_kinds() {
        let mut h = header(RecordKind::Call);
        h.kind = 99;
        assert_eq!(decode(&bytes_of(&h)), Err(DecodeError::UnknownKind { kind: 99 }));
        h.kind = 0;
        assert_eq!(decode(&bytes_of(&h)), Err(DecodeError::UnknownKind { kind: 0 }));
    }

    #[test]
    fn c_bytes_stops_at_nul() {
        assert_eq!(c_bytes(b"ab\0cd"), b"ab");
        assert_eq!(c_bytes(b"abcd"), b"abcd");
        assert_eq!(c_bytes(b"\0"), b"");
    }
}
