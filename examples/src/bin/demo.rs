//! The demo: a whole consumer group on one machine, with a crash and a join in the middle. What it does, step by
//! step, and its exit status: [`examples::demo`] (examples/src/demo).
//!
//! ```text
//! cargo run --release -p examples --bin demo
//! ```

#[tokio::main]
async fn main() -> std::process::ExitCode {
    examples::demo::main().await
}
