//! One line per figure, the same in every run so two runs compare line by line:
//! `| part | figure | value | unit | target | pass/fail |` (a Markdown table row).

/// The goal a figure is held to.
#[derive(Debug, Clone, Copy)]
pub enum Goal {
    /// At most this.
    AtMost(f64),
    /// At least this.
    AtLeast(f64),
    /// None: a baseline, a size, or a figure the issue gives no number for.
    None,
}

impl Goal {
    fn show(self) -> String {
        match self {
            Goal::AtMost(v) => format!("<= {}", num(v)),
            Goal::AtLeast(v) => format!(">= {}", num(v)),
            Goal::None => "-".into(),
        }
    }

    fn verdict(self, value: f64) -> &'static str {
        match self {
            Goal::AtMost(v) if value <= v => "pass",
            Goal::AtLeast(v) if value >= v => "pass",
            Goal::None => "-",
            _ => "FAIL",
        }
    }
}

/// Prints the table's head.
pub fn head(title: &str) {
    println!();
    println!("## {title}");
    println!("| part | figure | value | unit | target | pass/fail |");
    println!("|---|---|---:|---|---|---|");
}

/// Prints one figure.
pub fn figure(part: &str, name: &str, value: f64, unit: &str, goal: Goal) {
    println!(
        "| {part} | {name} | {} | {unit} | {} | {} |",
        num(value),
        goal.show(),
        goal.verdict(value)
    );
}

/// Prints a note under the table (what was run, what a figure means).
pub fn note(text: &str) {
    println!("  note: {text}");
}

/// A number with the digits that matter at its size.
fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}
