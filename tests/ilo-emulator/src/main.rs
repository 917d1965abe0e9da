//! `ilo-emulator`: emulated iLOs (RIBCL + Redfish over HTTPS) for tests and demos.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("the iLO emulator is not built yet")
}
