pub const EVENTS: &str = "EVENTS";
/// Per CPU, the ring calls and returns are written to ([`super::call_rings`]).
pub const CALL_RINGS: &str = "CALL_RINGS";
pub const TRACED_PIDS: &str = "TRACED_PIDS";
pub const TRACED_REMOVALS: &str = "TRACED_REMOVALS";
pub const TARGET_INODES: &str = "TARGET_INODES";
pub const RESOLVED_IMAGES: &str = "RESOLVED_IMAGES";
pub const LOST: &str = "LOST";
pub const CONFIG: &str = "CONFIG";
pub const INFLIGHT: &str = "INFLIGHT";
pub const STREAMS: &str = "STREAMS";
pub const USDT_SPECS: &str = "USDT_SPECS";
pub const USER_EVENT_SCRATCH: &str = "USER_EVENT_SCRATCH";
pub const TOP_FUNCTIONS: &str = "TOP_FUNCTIONS";
pub const TOP_BY_PROCESS: &str = "TOP_BY_PROCESS";
pub const TOP_STACKS: &str = "TOP_STACKS";
pub const LAYOUTS: &str = "LAYOUTS";
/// Each traced process's thread count (for `programs::SCHED_EXIT_1ARG`).
pub const THREAD_COUNTS: &str = "THREAD_COUNTS";
/// `-f 'FUNC if EXPR'`: each filtered function's compiled predicate ([`super::filter::Program`]).
pub const FILTERS: &str = "FILTERS";
/// Per function with a predicate, per CPU: calls seen and calls filtered out.
pub const FILTER_COUNTS: &str = "FILTER_COUNTS";
/// `--start-at`, `--stop-at`, `--depth`: each thread's gate ([`super::gate::Thread`]).
pub const GATES: &str = "GATES";
/// The role of each function with `cookie::GATE_ROLE` ([`super::gate::START`], ...).
pub const GATE_ROLES: &str = "GATE_ROLES";
