//! A seeded mutation driver for stable Rust: it takes the seed corpus, mutates inputs
//! (bit flips, interesting values, byte runs, inserts, deletes, splices between seeds) and
//! runs the target on each. Same seed, same inputs: a failure is replayed with its seed and
//! iteration, and the failing input is written out for the AFL++ binary or a unit test.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A small fast PRNG (xorshift64*): reproducible, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    u64::MAX,
];

/// One mutation of `input` (which may borrow from another seed for a splice).
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8], max_len: usize) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next_u64() as u8;
            }
            2 if len > 0 => {
                // An interesting value, little-endian, 1/2/4/8 bytes wide.
                let width = 1 << rng.below(4);
                let i = rng.below(len);
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let end = (i + width).min(len);
                input[i..end].copy_from_slice(&v[..end - i]);
            }
            3 if len < max_len => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let b = rng.next_u64() as u8;
                input.splice(i..i, std::iter::repeat_n(b, n));
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(32));
                input.drain(i..i + n);
            }
            5 if !other.is_empty() => {
                // Splice: a piece of another seed over or into this one.
                let a = rng.below(other.len());
                let n = 1 + rng.below((other.len() - a).min(256));
                let i = rng.below(len + 1);
                if rng.below(2) == 0 {
                    input.splice(i..(i + n).min(len), other[a..a + n].iter().copied());
                } else {
                    input.splice(i..i, other[a..a + n].iter().copied());
                }
            }
            6 if len > 1 => {
                // Duplicate a block (repeats a capsule, a request).
                let a = rng.below(len);
                let n = 1 + rng.below((len - a).min(128));
                let copy: Vec<u8> = input[a..a + n].to_vec();
                let i = rng.below(len + 1);
                input.splice(i..i, copy);
            }
            7 if len > 0 => {
                input.truncate(rng.below(len));
            }
            _ => {}
        }
    }
    input.truncate(max_len);
}

/// Reads every file of a corpus directory, sorted by name (deterministic order).
pub fn load_corpus(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut seeds: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
                .collect()
        })
        .unwrap_or_default();
    seeds.sort();
    seeds
}

/// How a run is bounded.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub iterations: u64,
    pub time: Duration,
}

/// A mutation that knows the input's structure (see [`crate::capsule::mutate`]).
pub type StructureMutator = fn(&mut Rng, &mut Vec<u8>);

/// Runs every seed once, then mutated inputs until the budget is spent. Returns how many
/// inputs ran. A failing input is saved as `<out>/crash-<seed>-<iteration>` before the
/// panic is passed on. With `structure`, half the inputs get its mutation as well.
pub fn run(
    target: fn(&[u8]),
    structure: Option<StructureMutator>,
    seeds: &[Vec<u8>],
    seed: u64,
    budget: Budget,
    max_len: usize,
    out: Option<&Path>,
) -> u64 {
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let mut execs = 0u64;
    let run_one = |input: &[u8], iteration: u64| {
        let result = std::panic::catch_unwind(|| target(input));
        if let Err(panic) = result {
            if let Some(dir) = out {
                let _ = std::fs::create_dir_all(dir);
                let path = dir.join(format!("crash-{seed}-{iteration}"));
                let _ = std::fs::write(&path, input);
                eprintln!("failing input saved to {}", path.display());
            }
            std::panic::resume_unwind(panic);
        }
    };
    for s in seeds {
        run_one(s, execs);
        execs += 1;
    }
    let empty = Vec::new();
    while execs < budget.iterations && started.elapsed() < budget.time {
        let base = if seeds.is_empty() {
            &empty
        } else {
            &seeds[rng.below(seeds.len())]
        };
        let other = if seeds.is_empty() {
            &empty
        } else {
            &seeds[rng.below(seeds.len())]
        };
        let mut input = base.clone();
        match structure {
            Some(m) if rng.below(2) == 0 => {
                for _ in 0..1 + rng.below(3) {
                    m(&mut rng, &mut input);
                }
                if rng.below(4) == 0 {
                    mutate(&mut rng, &mut input, other, max_len);
                }
            }
            _ => mutate(&mut rng, &mut input, other, max_len),
        }
        input.truncate(max_len);
        run_one(&input, execs);
        execs += 1;
    }
    execs
}
