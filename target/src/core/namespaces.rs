//! A reactor's namespaces: one table entry per namespace it has a bdev channel to, found by
//! index. A command resolves its namespace once, in `prepare` (the slot its queue's last
//! command resolved, if it named the same NSID and the slot is live; else two hash lookups:
//! subsystem, then NSID); the visibility re-check at execute, the bdev submission and the
//! completion's accounting go straight to the entry through the request's [`NsSlot`].
//!
//! An entry removed while requests still name it (the namespace was detached or replaced)
//! moves its generation on, so those requests find nothing instead of another namespace that
//! took the index.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::bdev::{BdevChannel, BdevIo};
use crate::core::latency::NamespaceLatency;
use crate::core::reservation::ResvView;
use crate::core::subsystem::{Namespace, SubsystemConfig};

/// A namespace as one reactor serves it: the shared description plus this reactor's channel.
pub(crate) struct GroupNamespace {
    pub ns: Arc<Namespace>,
    /// The snapshot of its subsystem this reactor has now (masking and ANA are read here).
    pub config: Arc<SubsystemConfig>,
    pub channel: Box<dyn BdevChannel>,
    /// I/O the channel refused for lack of resources, retried after its next poll.
    pub retry: VecDeque<BdevIo>,
    /// This reactor's read and write latencies on the namespace.
    pub latency: NamespaceLatency,
    /// I/O submitted to it (in the channel or in `retry`) and not yet completed. While it is
    /// above zero the namespace is on its core's list of channels to poll.
    pub out: u32,
    /// The reservation state this reactor checks its I/O against.
    pub resv: ResvView,
    /// Why the bdev channel failed to open here (`channel` then fails every I/O): the
    /// errno and the message.
    pub open_error: Option<(i32, String)>,
}

/// Where a request's namespace sits in its reactor's [`NamespaceTable`]. The default names
/// nothing (generation 0 is never live).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NsSlot {
    index: u32,
    gen: u32,
}

struct Entry<T> {
    gen: u32,
    ns: Option<T>,
}

/// Generic over what it holds only so its tests need no bdev.
pub(crate) struct NamespaceTable<T = GroupNamespace> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
}

impl<T> Default for NamespaceTable<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> NamespaceTable<T> {
    pub fn insert(&mut self, ns: T) -> NsSlot {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry { gen: 0, ns: None });
                (self.entries.len() - 1) as u32
            }
        };
        let entry = &mut self.entries[index as usize];
        entry.gen = entry.gen.wrapping_add(1).max(1);
        entry.ns = Some(ns);
        NsSlot {
            index,
            gen: entry.gen,
        }
    }

    /// Takes the namespace out; requests that still name the slot find nothing from now on.
    pub fn remove(&mut self, slot: NsSlot) -> Option<T> {
        let entry = self
            .entries
            .get_mut(slot.index as usize)
            .filter(|e| e.gen == slot.gen)?;
        let ns = entry.ns.take()?;
        entry.gen = entry.gen.wrapping_add(1).max(1);
        self.free.push(slot.index);
        Some(ns)
    }

    #[inline]
    pub fn get(&self, slot: NsSlot) -> Option<&T> {
        self.entries
            .get(slot.index as usize)
            .filter(|e| e.gen == slot.gen)
            .and_then(|e| e.ns.as_ref())
    }

    #[inline]
    pub fn get_mut(&mut self, slot: NsSlot) -> Option<&mut T> {
        self.entries
            .get_mut(slot.index as usize)
            .filter(|e| e.gen == slot.gen)
            .and_then(|e| e.ns.as_mut())
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().filter_map(|e| e.ns.as_ref())
    }

    /// Indexes the table has handed out (live or free): a bound on the namespaces a list of
    /// slots can hold, one per index.
    pub fn indexes(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_namespace_is_not_found_through_its_old_slot_even_when_the_index_is_reused() {
        let mut t = NamespaceTable::<&str>::default();
        assert!(
            t.get(NsSlot::default()).is_none(),
            "the default slot names nothing"
        );
        let a = t.insert("a");
        let b = t.insert("b");
        assert_eq!((t.get(a), t.get(b)), (Some(&"a"), Some(&"b")));
        assert_eq!(t.remove(a), Some("a"));
        assert!(t.get(a).is_none());
        assert!(t.remove(a).is_none(), "removed once only");
        let c = t.insert("c");
        assert_eq!(c.index, a.index, "the freed index is reused");
        assert!(
            t.get(a).is_none(),
            "a request of the old namespace finds nothing"
        );
        assert_eq!(t.get(c), Some(&"c"));
        *t.get_mut(c).unwrap() = "c2";
        let mut all: Vec<_> = t.iter().copied().collect();
        all.sort();
        assert_eq!(all, ["b", "c2"]);
    }
}
