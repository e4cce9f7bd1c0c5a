//! ptxas on a test's PTX, where `PTXAS` names it (CI installs it; the GPU machine has it).

/// Assembles `ptx` for sm_90a with `ptxas -v` into a scratch folder: `None` (after a visible
/// SKIP line naming `test`) when `PTXAS` is not set; else ptxas's report, after asserting that it
/// assembled with no spills and no warnings (`what` names the form in the failure).
pub fn assemble_clean(test: &str, what: &str, ptx: &str) -> Option<String> {
    let Some(ptxas) = std::env::var_os("PTXAS") else {
        eprintln!("SKIP {test} (ptxas): PTXAS is not set");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("trident-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("kernel.ptx");
    std::fs::write(&p, ptx).unwrap();
    let o = std::process::Command::new(&ptxas)
        .args(["-arch=sm_90a", "-v"])
        .arg(&p)
        .arg("-o")
        .arg(p.with_extension("cubin"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    let spills = log.lines().any(|l| l.contains("spill stores") && !l.contains(" 0 bytes spill stores"));
    assert!(o.status.success() && !spills && !log.contains("warning"), "{what}:\n{log}");
    Some(log)
}
