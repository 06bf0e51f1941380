//! Decodes one pickle file and prints how long reading and rewriting took
//! (for triaging fuzz artifacts): `cargo run --release --example time_one FILE`.
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: time_one FILE");
        std::process::exit(2);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(2);
        }
    };
    let t = std::time::Instant::now();
    let per_byte = std::env::var("PER_BYTE").ok().and_then(|s| s.parse().ok()).unwrap_or(16);
    let limits =
        pmstate_pickle::Limits { max_nodes: 1 << 20, max_nodes_per_input_byte: per_byte, ..Default::default() };
    let r = pmstate_pickle::from_slice(&bytes, &limits);
    println!("read: {:?} in {:?}", r.as_ref().map(|v| v.node_count()), t.elapsed());
    if let Ok(v) = r {
        let t = std::time::Instant::now();
        let w = pmstate_pickle::to_vec(&v);
        println!("write: {:?} in {:?}", w.as_ref().map(|b| b.len()), t.elapsed());
    }
}
