//! Assignor benchmark: target computation for 100/1,000 members x 1,024/50,000 shards, full (from nothing) and
//! incremental (one member joins a balanced group), plus shards moved on that join against the minimum possible.
//! Run: `cargo bench -p coord-server --bench assignor`. Goal (issue 7): 1,000 x 50,000 <= 20 ms.

use coord_server::state_machine::assignor::assign;
use protocol::names::MemberId;
use std::time::{Duration, Instant};

fn members(n: usize) -> Vec<MemberId> {
    (0..n)
        .map(|i| MemberId::new(format!("member-{i:05}")).expect("valid name"))
        .collect()
}

fn median<F: FnMut()>(runs: usize, mut f: F) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn main() {
    println!("| members | shards | full (median) | one join (median) | moved on join | minimum |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for &(n, shards) in &[(100usize, 1_024u32), (100, 50_000), (1_000, 1_024), (1_000, 50_000)] {
        let before = members(n);
        let refs: Vec<&MemberId> = before.iter().collect();
        let none = vec![None; shards as usize];
        let full = median(9, || {
            std::hint::black_box(assign(shards, &refs, &none));
        });
        let current = assign(shards, &refs, &none);
        let mut after = members(n);
        after.push(MemberId::new("member-new").expect("valid name"));
        let refs_after: Vec<&MemberId> = after.iter().collect();
        let cur: Vec<Option<&MemberId>> = current.iter().map(|t| t.as_ref()).collect();
        let join = median(9, || {
            std::hint::black_box(assign(shards, &refs_after, &cur));
        });
        let next = assign(shards, &refs_after, &cur);
        let moved = current.iter().zip(&next).filter(|(a, b)| a != b).count();
        let minimum = shards as usize / (n + 1);
        println!(
            "| {n} | {shards} | {:.2} ms | {:.2} ms | {moved} | {minimum} |",
            full.as_secs_f64() * 1e3,
            join.as_secs_f64() * 1e3
        );
    }
}
