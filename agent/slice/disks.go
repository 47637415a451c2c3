package slice

import (
	"context"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/disk"
)

// HostDisks is Disks on a host root through hostops/disk.
type HostDisks struct {
	Root hostops.Root
	// Runner runs qemu-img, blkdiscard and nvme (nil: disk.ExecRunner).
	Runner disk.Runner
	// Digests remembers verified images across clones.
	Digests *disk.DigestCache
	// Verify tunes the post-wipe verification (zero value: 256 samples).
	Verify disk.VerifyOptions
}

// Resolve implements Disks.
func (h HostDisks) Resolve(id disk.Identity) (disk.Device, error) { return disk.Resolve(h.Root, id) }

// CheckSafe implements Disks.
func (h HostDisks) CheckSafe(dev disk.Device, id disk.Identity) error {
	return disk.CheckSafe(h.Root, dev, id)
}

// Clone implements Disks.
func (h HostDisks) Clone(ctx context.Context, dev disk.Device, img disk.Image, progress func(disk.Progress)) (disk.CloneResult, error) {
	return disk.Clone(ctx, dev, img, disk.CloneOptions{Runner: h.Runner, Progress: progress, Digests: h.Digests})
}

// Wipe implements Disks.
func (h HostDisks) Wipe(ctx context.Context, dev disk.Device, policy disk.Policy, progress func(disk.Progress)) (disk.Proof, error) {
	return disk.Wipe(ctx, dev, policy, disk.WipeOptions{Runner: h.Runner, Progress: progress, Verify: h.Verify})
}
