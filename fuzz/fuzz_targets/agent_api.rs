//! The agent's command API bodies (`POST /v1/commands`): `CommandRequest::from_json`, the
//! checks `api::server` makes, then each extension's `start`, which reads and checks the
//! parameters before anything runs (`standby.prepare_image` with its image info, partition job
//! and config drive, `iscsi.start_iscsi_target`, `clean.execute_clean_step`,
//! `deploy.execute_deploy_step`, `image.install_bootloader`). The future a command returns is
//! dropped unpolled: running it would touch disks.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tokio::sync::Notify;
use vmdeploy_agent::api::clean::{check_versions, Clean};
use vmdeploy_agent::api::deploy::Deploy;
use vmdeploy_agent::api::image::Image;
use vmdeploy_agent::api::iscsi::Iscsi;
use vmdeploy_agent::api::server::StartError;
use vmdeploy_agent::api::standby::{expected_digest, DiskChoice, Standby};
use vmdeploy_shared::api::ipa::CommandRequest;

struct Extensions {
    standby: Arc<Standby>,
    iscsi: Iscsi,
    clean: Clean,
    deploy: Deploy,
    image: Image,
}

fn extensions() -> &'static Extensions {
    static EXT: OnceLock<Extensions> = OnceLock::new();
    EXT.get_or_init(|| {
        // No install disk: every command that would need one fails when run, never at start.
        let disk: DiskChoice = Arc::new(Err("no disk while fuzzing".into()));
        let standby = Arc::new(Standby {
            disk: Arc::clone(&disk),
            ca_pem: None,
            progress: Default::default(),
            power_off: Arc::new(Notify::new()),
            installed: Default::default(),
        });
        Extensions {
            iscsi: Iscsi {
                disk: Arc::clone(&disk),
                bind: [127, 0, 0, 1].into(),
                stop: Arc::new(Notify::new()),
                running: Default::default(),
            },
            clean: Clean {
                disk: Arc::clone(&disk),
            },
            deploy: Deploy {
                standby: Arc::clone(&standby),
                disk: Arc::clone(&disk),
            },
            image: Image {
                disk: Arc::clone(&disk),
                installed: Default::default(),
                grub_efi: PathBuf::from("/nonexistent/grubx64.efi"),
                // Not this machine's boot parameters: the same for every run.
                secure_boot: || vmdeploy_agent::firmware::SecureBoot::Disabled,
            },
            standby,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let request = match CommandRequest::from_json(data) {
        Ok(r) => r,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    if !request.params.is_object() {
        return;
    }
    let Some((extension, command)) = request.name.split_once('.') else {
        return;
    };
    let ext = extensions();
    let params = &request.params;
    let started = match extension {
        "standby" => ext.standby.start(command, params),
        "iscsi" => ext.iscsi.start(command, params),
        "clean" => ext.clean.start(command, params),
        "deploy" => ext.deploy.start(command, params),
        "image" => ext.image.start(command, params),
        other => Err(StartError::UnknownExtension(other.into())),
    };
    if let Err(e) = started {
        assert!(!e.to_string().is_empty());
    }
    // The pieces the extensions check again when they run.
    if let Some(info) = params.get("image_info") {
        let _ = expected_digest(info);
    }
    for key in ["clean_version", "deploy_version"] {
        let _ = check_versions(params.get(key));
    }
});
