//! `vmdeploy-image-build`: builds the deploy ISO and instance boot ISOs.

fn main() -> anyhow::Result<()> {
    println!("vmdeploy-image-build {}", env!("CARGO_PKG_VERSION"));
    Ok(())
}
