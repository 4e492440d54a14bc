//! From the kernel's signal records to events: a signal's generation and its delivery, which the
//! flow matcher links.

use tracer_common::SignalRecord;

use crate::event::{EventData, SignalId, data};

/// The event for a signal record, with its `flow_id` left for the flow matcher.
pub fn signal_event(pid: u32, r: &SignalRecord) -> EventData {
    let delivered = r.delivered != 0;
    EventData::Signal(data::Signal {
        signal: SignalId::new(r.signal as i32),
        // At generation the sender is the current process; at delivery the siginfo says who sent
        // it (the matcher replaces it with the generation's sender when it links them).
        sender_pid: if delivered { r.si_pid } else { pid },
        target_pid: r.target_pid,
        target_tid: r.target_tid,
        delivered,
        flow_id: None,
        group: r.group != 0,
        // TRACE_SIGNAL_DELIVERED (0) and TRACE_SIGNAL_LOSE_INFO (4) leave the signal pending.
        queued: delivered || r.result == 0 || r.result == 4,
    })
}

#[cfg(test)]
mod tests {
    use tracer_common::{RecordHeader, RecordKind};

    use super::*;

    #[test]
    fn signal_results() {
        let mut r = SignalRecord {
            header: RecordHeader { kind: RecordKind::Signal as u32, _pad: 0, ts_boot_ns: 1, pid: 7, tid: 7 },
            signal: 10,
            delivered: 0,
            target_pid: 8,
            target_tid: 8,
            code: 0,
            si_pid: 0,
            group: 1,
            result: 2,
        };
        let EventData::Signal(data::Signal { queued, sender_pid, group, .. }) = signal_event(7, &r) else { panic!() };
        assert!(!queued, "already pending: not queued again");
        assert_eq!(sender_pid, 7);
        assert!(group);
        r.result = 0;
        let EventData::Signal(data::Signal { queued, .. }) = signal_event(7, &r) else { panic!() };
        assert!(queued);
    }
}
