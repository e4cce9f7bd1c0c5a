//! Hardware work queues: how many streams a world may give the ranks of one device.
//!
//! A GPU runs the work of its streams from a fixed number of hardware queues (CUDA's
//! connections, `CUDA_DEVICE_MAX_CONNECTIONS`: 8 by default, at most 32; HIP's
//! `GPU_MAX_HW_QUEUES`, 4 by default), each read in order. A stream wait
//! (`cuStreamWaitValue64`) blocks its queue until the value arrives, so with more streams than
//! queues the copy or signal that would satisfy a wait can sit behind it: on the H200 the
//! copy-engine AllGather failed at 9 ranks on one GPU and hung at 12 and 16 with 8 queues, and
//! passed at 16 with 32 (issue 24). A world therefore creates all its streams up front, as many
//! per rank as its options say, and is refused with a typed error when the ranks sharing a
//! device would need more streams than the device has queues.

use trident_core::backend::BackendError;

/// The hardware queues of one device, as its driver sized them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HardwareQueues {
    /// Queues the device's streams share (`u32::MAX`: as many as there are streams).
    pub queues: u32,
    /// The most the vendor allows.
    pub max: u32,
    /// What sizes them and when it is read ("CUDA_DEVICE_MAX_CONNECTIONS, read when the
    /// process creates its CUDA context").
    pub setting: String,
}

impl HardwareQueues {
    /// A device whose every stream has a queue of its own.
    pub fn unlimited() -> HardwareQueues {
        HardwareQueues { queues: u32::MAX, max: u32::MAX, setting: String::new() }
    }
}

/// Refuses a world in which `ranks` ranks with `streams` streams each share `device`, when the
/// device cannot give every stream a queue of its own.
pub fn check_queues(device: &str, ranks: usize, streams: usize, hq: &HardwareQueues) -> Result<(), BackendError> {
    let need = ranks as u64 * streams as u64;
    if need <= hq.queues as u64 {
        return Ok(());
    }
    let fit = hq.queues as usize / streams.max(1);
    let raise = if hq.queues < hq.max {
        format!("; raise it up to {} before the process starts", hq.max)
    } else {
        String::new()
    };
    Err(BackendError::Host(format!(
        "{ranks} ranks x {streams} streams = {need} streams on {device}, which runs streams from {} hardware queues ({}{raise}): a stream wait blocks its queue, so the work that would satisfy it could wait behind it forever. At most {fit} ranks with {streams} streams each fit on this device (fewer streams per rank: GpuWorldOptions::streams_per_rank)",
        hq.queues, hq.setting
    )))
}

#[cfg(test)]
mod tests {
    use super::{check_queues, HardwareQueues};

    #[test]
    fn a_world_needing_more_streams_than_queues_is_refused_with_what_fits() {
        let hq = HardwareQueues { queues: 8, max: 32, setting: "CUDA_DEVICE_MAX_CONNECTIONS=8".into() };
        assert!(check_queues("NVIDIA H200", 4, 2, &hq).is_ok());
        let e = check_queues("NVIDIA H200", 9, 2, &hq).unwrap_err().to_string();
        assert!(e.contains("9 ranks x 2 streams = 18 streams on NVIDIA H200"), "{e}");
        assert!(e.contains("8 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=8; raise it up to 32"), "{e}");
        assert!(e.contains("At most 4 ranks"), "{e}");
        let full = HardwareQueues { queues: 32, ..hq };
        assert!(check_queues("NVIDIA H200", 16, 2, &full).is_ok());
        let e = check_queues("NVIDIA H200", 32, 2, &full).unwrap_err().to_string();
        assert!(!e.contains("raise it") && e.contains("At most 16 ranks"), "{e}");
        assert!(check_queues("fake", 64, 4, &HardwareQueues::unlimited()).is_ok());
    }
}
