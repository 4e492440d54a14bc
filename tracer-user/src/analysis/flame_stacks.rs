//! Time per call stack, aggregated over a whole trace: what flame graphs and folded stacks show.
//!
//! Each call slice (see [`super::slices`]) adds its inclusive duration to the node of its
//! stack: the process, then its callers' functions outermost first, then its own. So a node's
//! value is the time spent with that stack active, and its children never sum to more than it.
//! Only active call-stack time counts: a thread between traced calls adds nothing. Threads of a
//! process merge under the process. Stacks are at most [`super::slices::MAX_DEPTH`] frames:
//! deeper calls are folded into the frame at the cap. Calls still open when tracing stops count up
//! to the stop time. A process none of whose calls returned is left out.
//!
//! Memory grows with the number of distinct stacks, not with the number of events.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use serde::Serialize;

use super::{
    processes::ProcessNames,
    slices::{CallEvent, CallTracker, Calls, Ending, Slice},
};
use crate::event::{Event, TraceEnd, TraceStart};

/// A flame graph node, as d3-flame-graph and the issue's `.flame.json` format have it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlameNode {
    pub name: String,
    /// Nanoseconds with this stack active (inclusive of the children).
    pub value: u64,
    pub children: Vec<FlameNode>,
}

#[derive(Debug)]
struct Node {
    name: Arc<str>,
    value: u64,
    children: Vec<usize>,
}

/// Collects call stacks from a trace's events; see the module documentation.
#[derive(Debug, Default)]
pub struct StackCollector {
    tracker: CallTracker,
    names: ProcessNames,
    tree: StackTree,
}

/// The stacks seen so far, as a tree of nodes per process.
#[derive(Debug, Default)]
struct StackTree {
    nodes: Vec<Node>,
    /// The node for a function under a parent node.
    child_index: HashMap<(usize, Arc<str>), usize>,
    /// The root node of each process.
    roots: HashMap<u32, usize>,
    /// Processes with at least one call that returned.
    returned: HashSet<u32>,
}

impl StackCollector {
    pub fn new(tracker: CallTracker) -> Self {
        StackCollector { tracker, ..StackCollector::default() }
    }

    pub fn begin(&mut self, start: &TraceStart) {
        self.names.begin(start);
    }

    pub fn event(&mut self, e: &Event) {
        self.names.event(e);
        self.tree.add_all(self.tracker.event(e));
    }

    /// Ends the calls still open at the trace's end; returns the flame graph roots, one per process,
    /// by total time descending (children by name).
    pub fn finish(&mut self, end: &TraceEnd) -> Vec<FlameNode> {
        self.end_calls(end);
        self.snapshot()
    }

    /// Ends the calls still open at the trace's end (then [`Self::roots`] is the whole trace's).
    pub fn end_calls(&mut self, end: &TraceEnd) {
        self.tree.add_all(self.tracker.finish(end.ts));
    }

    /// The flame graph roots of the calls that ended so far (for a live view), as [`Self::finish`]
    /// orders them.
    pub fn snapshot(&self) -> Vec<FlameNode> {
        self.roots().into_iter().map(|(_, node)| node).collect()
    }

    /// [`Self::snapshot`], each root with its process's pid.
    pub fn roots(&self) -> Vec<(u32, FlameNode)> {
        let tree = &self.tree;
        let mut roots: Vec<(u32, usize)> =
            tree.roots.iter().filter(|(pid, _)| tree.returned.contains(pid)).map(|(p, n)| (*p, *n)).collect();
        roots.sort_by_key(|&(pid, node)| (std::cmp::Reverse(tree.nodes[node].value), pid));
        roots.into_iter().map(|(pid, node)| (pid, tree.flame_node(node, self.names.label(pid)))).collect()
    }
}

impl StackTree {
    fn new_node(&mut self, name: Arc<str>) -> usize {
        self.nodes.push(Node { name, value: 0, children: Vec::new() });
        self.nodes.len() - 1
    }

    fn child(&mut self, parent: usize, function: &Arc<str>) -> usize {
        if let Some(&node) = self.child_index.get(&(parent, function.clone())) {
            return node;
        }
        let node = self.new_node(function.clone());
        self.nodes[parent].children.push(node);
        self.child_index.insert((parent, function.clone()), node);
        node
    }

    fn flame_node(&self, node: usize, name: String) -> FlameNode {
        let mut children: Vec<FlameNode> =
            self.nodes[node].children.iter().map(|&c| self.flame_node(c, self.nodes[c].name.to_string())).collect();
        children.sort_by(|a, b| a.name.cmp(&b.name));
        FlameNode { name, value: self.nodes[node].value, children }
    }

    /// Adds each call that ended to the node of its stack.
    fn add_all(&mut self, mut calls: Calls) {
        while let Some(c) = calls.next() {
            if let CallEvent::End(slice) = c {
                self.add(&slice);
            }
        }
    }

    fn add(&mut self, slice: &Slice) {
        if matches!(slice.ending, Ending::Returned { .. }) {
            self.returned.insert(slice.pid);
        }
        let duration = slice.duration();
        let root = match self.roots.get(&slice.pid) {
            Some(&root) => root,
            None => {
                let root = self.new_node("".into());
                self.roots.insert(slice.pid, root);
                root
            }
        };
        // Only outermost calls add to the process: the others are inside them.
        if slice.depth() == 0 {
            self.nodes[root].value += duration;
        }
        let mut node = root;
        for f in slice.callers.iter().map(|f| &f.function).chain([&slice.frame.function]) {
            node = self.child(node, f);
        }
        self.nodes[node].value += duration;
    }
}

/// Folded stacks (`proc;frame;frame value`, one line per stack with self time): what inferno,
/// flamegraph.pl and speedscope read. Calls `line` with each line (without its newline), depth
/// first, children by name; a stack's value is its node's time minus its children's. `;` inside a
/// name would split it into frames, so it becomes `:`.
pub fn for_each_folded_line<E>(roots: &[FlameNode], line: &mut dyn FnMut(&str) -> Result<(), E>) -> Result<(), E> {
    fn walk<E>(node: &FlameNode, path: &mut String, line: &mut dyn FnMut(&str) -> Result<(), E>) -> Result<(), E> {
        let len = path.len();
        if !path.is_empty() {
            path.push(';');
        }
        path.push_str(&node.name.replace(';', ":"));
        let children: u64 = node.children.iter().map(|c| c.value).sum();
        let own = node.value.saturating_sub(children);
        if own > 0 {
            let at = path.len();
            path.push_str(&format!(" {own}"));
            line(path)?;
            path.truncate(at);
        }
        for c in &node.children {
            walk(c, path, line)?;
        }
        path.truncate(len);
        Ok(())
    }
    let mut path = String::new();
    roots.iter().try_for_each(|root| walk(root, &mut path, line))
}

/// All folded lines, in the order [`for_each_folded_line`] gives them.
pub fn folded_lines(roots: &[FlameNode]) -> Vec<String> {
    let mut out = Vec::new();
    let _ = for_each_folded_line::<()>(roots, &mut |l| {
        out.push(l.to_string());
        Ok(())
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::{call, call_in, ret, ret_in};

    fn flame(max_depth: usize, events: &[Event], end_ts: u64) -> Vec<FlameNode> {
        let mut c = StackCollector::new(CallTracker::new(max_depth));
        c.begin(&crate::event::test_events::start(0));
        for e in events {
            c.event(e);
        }
        c.finish(&crate::event::test_events::end(end_ts))
    }

    fn node(name: &str, value: u64, children: Vec<FlameNode>) -> FlameNode {
        FlameNode { name: name.into(), value, children }
    }

    #[test]
    fn nested_calls_and_two_threads_merge_under_the_process() {
        let roots = flame(
            64,
            &[
                call(100, 1, "main"),
                call(200, 1, "work"),
                call(210, 2, "work"),
                ret(300, 1, "work", Some(100)),
                call(400, 1, "work"),
                ret(450, 1, "work", Some(50)),
                ret(500, 2, "work", Some(290)),
                ret(1100, 1, "main", Some(1000)),
            ],
            2000,
        );
        assert_eq!(
            roots,
            vec![node(
                "app (1)",
                1290,
                vec![node("main", 1000, vec![node("work", 150, vec![])]), node("work", 290, vec![])]
            )]
        );
        assert_eq!(folded_lines(&roots), ["app (1);main 850", "app (1);main;work 150", "app (1);work 290"]);
    }

    #[test]
    fn recursion_past_the_cap_folds_into_the_frame_at_the_cap() {
        let mut events: Vec<Event> = (0..5).map(|i| call(100 + 10 * i, 1, "r")).collect();
        for i in (0..5).rev() {
            let end = 200 + 10 * (4 - i);
            events.push(ret(end, 1, "r", Some(end - (100 + 10 * i))));
        }
        let roots = flame(3, &events, 1000);
        assert_eq!(
            roots,
            vec![node("app (1)", 140, vec![node("r", 140, vec![node("r", 120, vec![node("r", 100, vec![])])])])]
        );
        assert_eq!(folded_lines(&roots), ["app (1);r 20", "app (1);r;r 20", "app (1);r;r;r 100"]);
    }

    #[test]
    fn unfinished_calls_count_up_to_the_stop_and_lost_returns_to_their_caller_s_return() {
        // main never returns (open at stop, 1000); lost's return was lost, so it ends with work.
        let roots = flame(
            64,
            &[
                call(100, 1, "main"),
                call(200, 1, "work"),
                call(250, 1, "lost"),
                ret(400, 1, "work", Some(200)),
                ret(600, 1, "late_call_line_lost", Some(100)),
            ],
            1000,
        );
        assert_eq!(
            roots,
            vec![node(
                "app (1)",
                900,
                vec![node(
                    "main",
                    900,
                    vec![node("late_call_line_lost", 100, vec![]), node("work", 200, vec![node("lost", 150, vec![])])]
                )]
            )]
        );
    }

    #[test]
    fn processes_without_a_returned_call_are_left_out_and_roots_sort_by_time() {
        let events = [
            call(100, 1, "short"),
            ret(150, 1, "short", Some(50)),
            call_in(100, 2, 2, "long"),
            ret_in(400, 2, 2, "long", Some(300)),
            call_in(100, 3, 3, "never_returns"),
        ];
        let roots = flame(64, &events, 1000);
        let names: Vec<(&str, u64)> = roots.iter().map(|r| (r.name.as_str(), r.value)).collect();
        assert_eq!(names, [("pid 2", 300), ("app (1)", 50)]);
    }
}
