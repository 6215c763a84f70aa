//! The set of bdevs a target knows, with claims: a bdev used by a namespace or stacked under
//! another bdev cannot be deleted, or given to another namespace, from under its user.
//! Control path only.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use super::{BdevError, BdevRef};

#[derive(Default)]
pub struct BdevRegistry {
    bdevs: BTreeMap<String, BdevRef>,
    /// bdev name -> who holds it ("EE_Malloc0", "nqn...:ns1").
    claims: BTreeMap<String, Claim>,
    /// Creation order, so a saved config recreates base bdevs before the ones stacked on them.
    order: Vec<String>,
}

/// A namespace's hold on its bdev, kept by the namespace itself: by the control plane's
/// configuration, and by each reactor's copy until that reactor's channel has drained the
/// namespace's I/O. The bdev stays claimed while one is alive, so removing a namespace does
/// not hand its bdev to another one while the old namespace's queued I/O can still reach it.
#[derive(Debug)]
pub struct BdevClaim(());

struct Claim {
    user: String,
    /// A namespace's claim ends when its last [`BdevClaim`] goes; a stacked bdev's (None)
    /// when that bdev is deleted.
    held_by: Option<Weak<BdevClaim>>,
}

impl Claim {
    fn is_live(&self) -> bool {
        self.held_by.as_ref().is_none_or(|w| w.strong_count() > 0)
    }
}

impl BdevRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a bdev and claims its base bdevs for it.
    pub fn register(&mut self, bdev: BdevRef) -> Result<(), BdevError> {
        let name = bdev.name().to_string();
        if self.bdevs.contains_key(&name) {
            return Err(BdevError::Exists(name));
        }
        let bases = bdev.base_bdevs();
        self.check_bases(&bases)?;
        for base in bases {
            let claim = Claim {
                user: name.clone(),
                held_by: None,
            };
            self.claims.insert(base, claim);
        }
        self.order.push(name.clone());
        self.bdevs.insert(name, bdev);
        Ok(())
    }

    /// Adds bdevs stacked together on the same bases (a split's parts): all or none, the
    /// bases claimed by the first for them all until the last is deleted.
    pub fn register_stack(&mut self, bdevs: Vec<BdevRef>) -> Result<(), BdevError> {
        let Some(first) = bdevs.first() else {
            return Ok(());
        };
        let bases = first.base_bdevs();
        for (i, bdev) in bdevs.iter().enumerate() {
            let name = bdev.name();
            if self.bdevs.contains_key(name) || bdevs[..i].iter().any(|b| b.name() == name) {
                return Err(BdevError::Exists(name.to_string()));
            }
            if bdev.base_bdevs() != bases {
                return Err(BdevError::InvalidParams(format!(
                    "{name} is not stacked on the same bdevs as {}",
                    first.name()
                )));
            }
        }
        self.check_bases(&bases)?;
        for base in bases {
            let claim = Claim {
                user: first.name().to_string(),
                held_by: None,
            };
            self.claims.insert(base, claim);
        }
        for bdev in bdevs {
            let name = bdev.name().to_string();
            self.order.push(name.clone());
            self.bdevs.insert(name, bdev);
        }
        Ok(())
    }

    /// Bases a new bdev may stack on: present and unclaimed.
    fn check_bases(&self, bases: &[String]) -> Result<(), BdevError> {
        for base in bases {
            if !self.bdevs.contains_key(base) {
                return Err(BdevError::NotFound(base.clone()));
            }
            if let Some(user) = self.claimed_by(base) {
                return Err(BdevError::Claimed {
                    name: base.clone(),
                    user: user.to_string(),
                });
            }
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&BdevRef> {
        self.bdevs.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.bdevs.contains_key(name)
    }

    /// Claims a bdev for `user` (a namespace), until the returned hold and every clone of it
    /// are gone; fails if the bdev is missing or already claimed.
    pub fn claim(
        &mut self,
        name: &str,
        user: &str,
    ) -> Result<(BdevRef, Arc<BdevClaim>), BdevError> {
        let bdev = self
            .bdevs
            .get(name)
            .cloned()
            .ok_or_else(|| BdevError::NotFound(name.to_string()))?;
        if let Some(holder) = self.claimed_by(name) {
            return Err(BdevError::Claimed {
                name: name.to_string(),
                user: holder.to_string(),
            });
        }
        let hold = Arc::new(BdevClaim(()));
        let claim = Claim {
            user: user.to_string(),
            held_by: Some(Arc::downgrade(&hold)),
        };
        self.claims.insert(name.to_string(), claim);
        Ok((bdev, hold))
    }

    pub fn claimed_by(&self, name: &str) -> Option<&str> {
        self.claims
            .get(name)
            .filter(|c| c.is_live())
            .map(|c| c.user.as_str())
    }

    /// Removes an unclaimed bdev and releases what it was stacked on.
    pub fn unregister(&mut self, name: &str) -> Result<BdevRef, BdevError> {
        if !self.bdevs.contains_key(name) {
            return Err(BdevError::NotFound(name.to_string()));
        }
        if let Some(user) = self.claimed_by(name) {
            return Err(BdevError::Claimed {
                name: name.to_string(),
                user: user.to_string(),
            });
        }
        self.claims.remove(name);
        let bdev = self.bdevs.remove(name).expect("checked above");
        // A base stays claimed while another bdev of the same stack is still on it.
        for base in bdev.base_bdevs() {
            if !self.bdevs.values().any(|b| b.base_bdevs().contains(&base)) {
                self.claims.remove(&base);
            }
        }
        self.order.retain(|n| n != name);
        bdev.on_delete();
        Ok(bdev)
    }

    /// All bdevs in creation order.
    pub fn iter(&self) -> impl Iterator<Item = &BdevRef> {
        self.order.iter().filter_map(|n| self.bdevs.get(n))
    }

    pub fn len(&self) -> usize {
        self.bdevs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bdevs.is_empty()
    }

    /// A name not yet taken, `<prefix><n>` with the smallest n (SPDK's "Malloc0", "Malloc1").
    pub fn next_free_name(&self, prefix: &str) -> String {
        (0..)
            .map(|n| format!("{prefix}{n}"))
            .find(|name| !self.bdevs.contains_key(name))
            .expect("an unbounded range always has a free name")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bdev::MallocBdev;

    /// A namespace's claim lasts as long as any copy of its hold: while one is alive the
    /// bdev can be neither claimed again nor deleted; with the last one gone, both can.
    #[test]
    fn a_claim_lasts_as_long_as_its_holds() {
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(MallocBdev::new("Malloc0", 64, 512, None).unwrap()))
            .unwrap();
        let (_, hold) = reg.claim("Malloc0", "nqn.a nsid 1").unwrap();
        let reactor_copy = Arc::clone(&hold);
        drop(hold);
        assert_eq!(reg.claimed_by("Malloc0"), Some("nqn.a nsid 1"));
        assert!(matches!(
            reg.claim("Malloc0", "nqn.b nsid 1"),
            Err(BdevError::Claimed { .. })
        ));
        assert!(matches!(
            reg.unregister("Malloc0"),
            Err(BdevError::Claimed { .. })
        ));
        drop(reactor_copy);
        assert_eq!(reg.claimed_by("Malloc0"), None);
        let (_, hold) = reg.claim("Malloc0", "nqn.b nsid 1").unwrap();
        drop(hold);
        reg.unregister("Malloc0").unwrap();
    }
}
