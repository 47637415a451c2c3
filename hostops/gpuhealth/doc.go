// Package gpuhealth reads the health of a host's NVIDIA GPUs from the
// sources a real H200 host offers, each through a hostops.Root or a
// command.Runner so lab/hostsim can provide the same bytes:
//
//   - the kernel log (/dev/kmsg records): NVRM Xid errors, split into
//     critical ones (the GPU needs a reset or replacement: 48, 63, 64, 74,
//     79, 92, 94, 95, ...) and informational ones (application faults
//     such as 13, 31, 43), see XIDs;
//   - PCI config space (sysfs "config"): a GPU that fell off the bus
//     reads all-ones (vendor 0xffff) while its sysfs attributes, cached
//     at enumeration, still look fine;
//   - nvidia-smi --query-gpu (CSV): uncorrectable ECC errors, row-remap
//     failure and pending remaps, hardware/software thermal slowdown;
//   - nvidia-smi nvlink -e: NVLink CRC and recovery error counters.
//
// The parsers are pure (ParseKmsg, ParseXID, ParseQuery, ParseNVLink) and
// table-tested; Faults turns their results into findings. nvidia-smi sees
// only GPUs bound to the nvidia driver, and only the nvidia driver logs
// Xids: a GPU passed through to a guest (vfio-pci) is judged by its
// config space and PCIe link alone on the host.
package gpuhealth
