//! The set of bdevs a target knows, with claims: a bdev used by a namespace or stacked under
//! another bdev cannot be deleted from under its user. Control path only.

use std::collections::BTreeMap;

use super::{BdevError, BdevRef};

#[derive(Default)]
pub struct BdevRegistry {
    bdevs: BTreeMap<String, BdevRef>,
    /// bdev name -> who holds it ("EE_Malloc0", "nqn...:ns1").
    claims: BTreeMap<String, String>,
    /// Creation order, so a saved config recreates base bdevs before the ones stacked on them.
    order: Vec<String>,
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
        for base in &bases {
            if !self.bdevs.contains_key(base) {
                return Err(BdevError::NotFound(base.clone()));
            }
            if let Some(user) = self.claims.get(base) {
                return Err(BdevError::Claimed {
                    name: base.clone(),
                    user: user.clone(),
                });
            }
        }
        for base in bases {
            self.claims.insert(base, name.clone());
        }
        self.order.push(name.clone());
        self.bdevs.insert(name, bdev);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&BdevRef> {
        self.bdevs.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.bdevs.contains_key(name)
    }

    /// Claims a bdev for `user` (a namespace); fails if missing or already claimed.
    pub fn claim(&mut self, name: &str, user: &str) -> Result<BdevRef, BdevError> {
        let bdev = self
            .bdevs
            .get(name)
            .cloned()
            .ok_or_else(|| BdevError::NotFound(name.to_string()))?;
        if let Some(holder) = self.claims.get(name) {
            return Err(BdevError::Claimed {
                name: name.to_string(),
                user: holder.clone(),
            });
        }
        self.claims.insert(name.to_string(), user.to_string());
        Ok(bdev)
    }

    pub fn release(&mut self, name: &str) {
        self.claims.remove(name);
    }

    pub fn claimed_by(&self, name: &str) -> Option<&str> {
        self.claims.get(name).map(String::as_str)
    }

    /// Removes an unclaimed bdev and releases what it was stacked on.
    pub fn unregister(&mut self, name: &str) -> Result<BdevRef, BdevError> {
        if !self.bdevs.contains_key(name) {
            return Err(BdevError::NotFound(name.to_string()));
        }
        if let Some(user) = self.claims.get(name) {
            return Err(BdevError::Claimed {
                name: name.to_string(),
                user: user.clone(),
            });
        }
        let bdev = self.bdevs.remove(name).expect("checked above");
        for base in bdev.base_bdevs() {
            self.claims.remove(&base);
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
