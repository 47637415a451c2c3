package disk

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/gpuaas/gpuaas/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fillRandom overwrites [off, off+n) of a file with seeded random bytes.
func fillRandom(t testing.TB, path string, off, n int64, seed uint64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 7})
	buf := make([]byte, 1<<20)
	for done := int64(0); done < n; {
		c := min(int64(len(buf)), n-done)
		_, _ = rng.Read(buf[:c])
		_, err := f.WriteAt(buf[:c], off+done)
		require.NoError(t, err)
		done += c
	}
}

func writeAt(t testing.TB, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
}

// digestRange hashes [off, off+n) of a file or device (n < 0: to the end).
func digestRange(t testing.TB, path string, off, n int64) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var r io.Reader = io.NewSectionReader(f, off, 1<<62)
	if n >= 0 {
		r = io.LimitReader(r, n)
	}
	h := sha256.New()
	_, err = io.Copy(h, r)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

func fileDigest(t testing.TB, path string) string { return digestRange(t, path, 0, -1) }

// requireZero asserts that [off, off+n) of the device reads as zeros.
func requireZero(t testing.TB, dev string, off, n int64) {
	t.Helper()
	f, err := os.Open(dev)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	for done := int64(0); done < n; {
		c := min(int64(len(buf)), n-done)
		_, err := f.ReadAt(buf[:c], off+done)
		require.NoError(t, err)
		if i := firstNonZero(buf[:c]); i >= 0 {
			t.Fatalf("%s: byte %d is not zero", dev, off+done+int64(i))
		}
		done += c
	}
}

// simDisk gives a real loop device the NVMe identity idA in a simulated
// sysfs and resolves it. realProc uses this machine's mount table.
func simDisk(t testing.TB, node string, realProc bool) (*simHost, Device) {
	t.Helper()
	h := newSimHost(t, realProc)
	h.addDisk(t, "nvme0n1", idA, node)
	dev, err := Resolve(h.root, idA)
	require.NoError(t, err)
	return h, dev
}

// sparseImage makes a raw image of size bytes with random data extents,
// one allocated all-zero extent and random bytes up to an unaligned end.
func sparseImage(t testing.TB, size int64) (path, digest string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "image.raw")
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	require.NoError(t, os.Truncate(path, size))
	fillRandom(t, path, 0, 4<<20, 1)
	fillRandom(t, path, 64<<20, 8<<20, 2)
	writeAt(t, path, 100<<20, make([]byte, 4<<20)) // allocated zeros
	fillRandom(t, path, size-5000, 5000, 3)
	return path, fileDigest(t, path)
}

// smallImage makes a raw image of size bytes (>= 2 MiB) with 1 MiB of
// random data at the start and 5000 random bytes at the end.
func smallImage(t testing.TB, size int64) (path, digest string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "image.raw")
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	require.NoError(t, os.Truncate(path, size))
	fillRandom(t, path, 0, 1<<20, 1)
	fillRandom(t, path, size-5000, 5000, 3)
	return path, fileDigest(t, path)
}

func TestPrivilegedCloneOntoRandomDevice(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "qemu-img")
	const devSize = 256 << 20
	imgSize := int64(150<<20) + 1000 // not sector aligned
	raw, rawDigest := sparseImage(t, imgSize)
	qcow := filepath.Join(t.TempDir(), "image.qcow2")
	run(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow)

	for _, tc := range []struct {
		name   string
		img    Image
		method CloneMethod
	}{
		{"raw native", Image{Path: raw, Format: FormatRaw, SHA256: rawDigest}, MethodAuto},
		{"raw qemu-img", Image{Path: raw, Format: FormatRaw, SHA256: rawDigest}, MethodQemuImg},
		{"qcow2", Image{Path: qcow, Format: FormatQCOW2, SHA256: fileDigest(t, qcow)}, MethodAuto},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, file := loopDevice(t, devSize, false)
			fillRandom(t, file, 0, devSize, 9)
			_, dev := simDisk(t, node, true)

			var last Progress
			var phases []string
			res, err := Clone(context.Background(), dev, tc.img, CloneOptions{Method: tc.method, Progress: func(p Progress) {
				if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
					phases = append(phases, p.Phase)
				}
				last = p
			}})
			require.NoError(t, err)
			assert.Equal(t, []string{"digest", "write"}, phases)
			assert.Equal(t, last.Total, last.Done)
			assert.Equal(t, int64(devSize), last.Total)

			// The image region matches the image; every gap inside it
			// (holes of the image) and the whole tail read zero.
			assert.Equal(t, rawDigest, digestRange(t, node, 0, imgSize))
			requireZero(t, node, 4<<20, 60<<20)
			requireZero(t, node, 100<<20, 4<<20)
			requireZero(t, node, imgSize, devSize-imgSize)
			assert.GreaterOrEqual(t, res.ImageBytes, imgSize)
			if res.Method == MethodNative {
				// Only the data extents are written as data.
				assert.Equal(t, int64(4<<20+8<<20+5120), res.DataBytes)
				assert.Equal(t, int64(devSize)-res.DataBytes-4<<20, res.ZeroedBytes)
			}
		})
	}
}

func TestPrivilegedCloneBadDigestWritesNothing(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	node, file := loopDevice(t, 64<<20, false)
	fillRandom(t, file, 0, 64<<20, 5)
	_, dev := simDisk(t, node, true)
	raw, digest := smallImage(t, 32<<20)
	before := fileDigest(t, node)

	bad := []byte(digest)
	if bad[0] == '0' { // another valid hex digest
		bad[0] = '1'
	} else {
		bad[0] = '0'
	}
	_, err := Clone(context.Background(), dev, Image{Path: raw, Format: FormatRaw, SHA256: string(bad)}, CloneOptions{})
	var dm *DigestMismatchError
	require.ErrorAs(t, err, &dm)
	assert.Contains(t, err.Error(), "nothing written")
	assert.Equal(t, before, fileDigest(t, node), "device changed after a digest mismatch")

	// Image changed after approval: same refusal.
	fillRandom(t, raw, 1<<20, 4096, 77)
	_, err = Clone(context.Background(), dev, Image{Path: raw, Format: FormatRaw, SHA256: digest}, CloneOptions{})
	require.ErrorAs(t, err, &dm)

	// A qcow2 file declared raw is refused before anything runs.
	qcow := filepath.Join(t.TempDir(), "x.qcow2")
	run(t, "qemu-img", "create", "-f", "qcow2", qcow, "1M")
	_, err = Clone(context.Background(), dev, Image{Path: qcow, Format: FormatRaw, SHA256: fileDigest(t, qcow)}, CloneOptions{})
	require.ErrorContains(t, err, "declared raw but is a qcow2 file")

	// Cancelled: nothing written either.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Clone(ctx, dev, Image{Path: raw, Format: FormatRaw, SHA256: fileDigest(t, raw)}, CloneOptions{})
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, before, fileDigest(t, node))
}

func TestPrivilegedCloneDigestCache(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	node, _ := loopDevice(t, 64<<20, false)
	_, dev := simDisk(t, node, true)
	raw, digest := smallImage(t, 16<<20)
	img := Image{Path: raw, Format: FormatRaw, SHA256: digest}
	cache := NewDigestCache()
	clone := func() ([]string, error) {
		var phases []string
		_, err := Clone(context.Background(), dev, img, CloneOptions{Digests: cache, Progress: func(p Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
		}})
		return phases, err
	}
	phases, err := clone()
	require.NoError(t, err)
	assert.Equal(t, []string{"digest", "write"}, phases)
	phases, err = clone()
	require.NoError(t, err)
	assert.Equal(t, []string{"write"}, phases, "an unchanged verified image is not hashed again")

	// Any write to the image (same size, same bytes count) forces a hash.
	fillRandom(t, raw, 4096, 4096, 99)
	_, err = clone()
	var dm *DigestMismatchError
	require.ErrorAs(t, err, &dm)
}

// A qcow2 image whose backing file points at a host device is refused:
// cloning it would copy host data into the tenant's disk.
func TestPrivilegedCloneRefusesBackingFile(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "qemu-img")
	node, _ := loopDevice(t, 64<<20, false)
	_, dev := simDisk(t, node, true)
	base := filepath.Join(t.TempDir(), "base.raw")
	require.NoError(t, os.WriteFile(base, make([]byte, 1<<20), 0o644))
	top := filepath.Join(t.TempDir(), "top.qcow2")
	run(t, "qemu-img", "create", "-f", "qcow2", "-F", "raw", "-b", base, top)
	_, err := Clone(context.Background(), dev, Image{Path: top, Format: FormatQCOW2, SHA256: fileDigest(t, top)}, CloneOptions{})
	require.ErrorContains(t, err, "has backing file")
}

func TestPrivilegedCloneQcow2Transcript(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "qemu-img")
	node, _ := loopDevice(t, 64<<20, false)
	_, dev := simDisk(t, node, true)
	raw, _ := smallImage(t, 16<<20)
	qcow := filepath.Join(t.TempDir(), "image.qcow2")
	run(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow)
	// Record while really running: the transcript is what ran.
	rec := &FakeRunner{Func: func(c Call, w io.Writer) error {
		return ExecRunner{}.Run(context.Background(), w, c.Name, c.Args...)
	}}
	_, err := Clone(context.Background(), dev, Image{Path: qcow, Format: FormatQCOW2, SHA256: fileDigest(t, qcow)}, CloneOptions{Runner: rec})
	require.NoError(t, err)
	want := []Call{
		{Name: "qemu-img", Args: []string{"info", "--output=json", "-f", "qcow2", qcow}},
		{Name: "qemu-img", Args: []string{"convert", "-p", "-n", "-t", "none", "-W", "-m", "16", "-f", "qcow2", "-O", "raw", qcow, dev.Path}},
	}
	assert.Empty(t, cmp.Diff(want, rec.Calls()))
	assert.Equal(t, fileDigest(t, raw), digestRange(t, node, 0, 16<<20))
}

// plant writes what a tenant leaves behind: a GPT with its backup header
// in the last sector, data at the start and an LVM2 label plus data at a
// random offset. It returns that offset.
func plant(t testing.TB, file string, size int64, seed uint64) int64 {
	t.Helper()
	fillRandom(t, file, 0, 2<<20, seed)
	writeAt(t, file, 512, []byte("EFI PART"))
	writeAt(t, file, size-512, []byte("EFI PART"))
	r := rand.New(rand.NewPCG(seed, 1))
	off := (4<<20 + r.Int64N(size-16<<20)) &^ 4095
	fillRandom(t, file, off, 1<<20, seed+1)
	lvm := append([]byte("LABELONE"), make([]byte, 16)...)
	writeAt(t, file, off+512, append(lvm, "LVM2 001"...))
	return off
}

func TestPrivilegedWipeVerify(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "blkdiscard")
	const size = 512 << 20
	node, file := loopDevice(t, size, false)
	_, dev := simDisk(t, node, true)
	ctx := context.Background()

	t.Run("wipe that skips the end is caught", func(t *testing.T) {
		plant(t, file, size, 1)
		bd, err := openBlock(dev.Path, true)
		require.NoError(t, err)
		require.NoError(t, bd.ZeroRange(ctx, 0, size-1<<20, nil))
		require.NoError(t, bd.Close())
		_, err = Verify(ctx, dev, VerifyOptions{})
		var ve *VerifyError
		require.ErrorAs(t, err, &ve)
		require.Len(t, ve.Findings, 1)
		assert.Equal(t, Finding{Kind: "tail", Offset: size - 512, Signature: "gpt_backup"}, ve.Findings[0])
		assert.Contains(t, err.Error(), "tail range has data at byte 536870400 (gpt_backup signature)")
	})

	t.Run("cancelled", func(t *testing.T) {
		plant(t, file, size, 6)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := Wipe(cctx, dev, PolicyZero, WipeOptions{})
		require.ErrorIs(t, err, context.Canceled)
		_, err = Verify(ctx, dev, VerifyOptions{})
		var ve *VerifyError
		require.ErrorAs(t, err, &ve, "a cancelled wipe must not verify")
	})

	t.Run("wipe that skips a quarter in the middle is caught", func(t *testing.T) {
		plant(t, file, size, 7)
		fillRandom(t, file, size/2, size/4, 8)
		bd, err := openBlock(dev.Path, true)
		require.NoError(t, err)
		require.NoError(t, bd.ZeroRange(ctx, 0, size/2, nil))
		require.NoError(t, bd.ZeroRange(ctx, size/2+size/4, size/4, nil))
		require.NoError(t, bd.Close())
		_, err = Verify(ctx, dev, VerifyOptions{}) // 256 samples: missing 1/4 has odds 0.75^256
		var ve *VerifyError
		require.ErrorAs(t, err, &ve)
		random := 0
		for _, f := range ve.Findings {
			if f.Kind == "random" {
				random++
			}
			assert.Contains(t, []string{"random", "superblock"}, f.Kind)
			assert.GreaterOrEqual(t, f.Offset, int64(size/2))
			assert.Less(t, f.Offset, int64(size/2+size/4))
		}
		assert.Greater(t, random, 20, "about a quarter of 256 samples land there")
	})

	t.Run("zero", func(t *testing.T) {
		off := plant(t, file, size, 2)
		proof, err := Wipe(ctx, dev, PolicyZero, WipeOptions{Verify: VerifyOptions{Samples: 64, Seed: 99}})
		require.NoError(t, err)
		requireZero(t, node, off, 1<<20)
		requireZero(t, node, size-1<<20, 1<<20)
		checkProof(t, proof, PolicyZero, size, 64)
		assert.Equal(t, uint64(99), proof.Seed)
	})

	t.Run("blkdiscard", func(t *testing.T) {
		off := plant(t, file, size, 3)
		rec := &FakeRunner{Func: func(c Call, w io.Writer) error { return ExecRunner{}.Run(ctx, w, c.Name, c.Args...) }}
		proof, err := Wipe(ctx, dev, PolicyDiscard, WipeOptions{Runner: rec})
		require.NoError(t, err)
		assert.Empty(t, cmp.Diff([]Call{{Name: "blkdiscard", Args: []string{dev.Path}}}, rec.Calls()))
		requireZero(t, node, off, 1<<20)
		checkProof(t, proof, PolicyDiscard, size, 256)
		// The loop device turned the discard into holes: the backing
		// file holds (almost) nothing any more.
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(file, &st))
		assert.Less(t, st.Blocks*512, int64(1<<20))
	})

	// No NVMe here: the fake nvme stands in for the controller. A format
	// that erased proves out; one that did not is caught by the verify.
	t.Run("nvme format transcript", func(t *testing.T) {
		want := []Call{{Name: "nvme", Args: []string{"format", dev.Path, "--ses=1", "--force"}}}
		plant(t, file, size, 4)
		erasing := &FakeRunner{Func: func(c Call, w io.Writer) error {
			bd, err := openBlock(c.Args[1], true)
			if err != nil {
				return err
			}
			defer bd.Close()
			return bd.ZeroRange(ctx, 0, bd.size, nil)
		}}
		proof, err := Wipe(ctx, dev, PolicyNVMeFormat, WipeOptions{Runner: erasing})
		require.NoError(t, err)
		assert.Empty(t, cmp.Diff(want, erasing.Calls()))
		checkProof(t, proof, PolicyNVMeFormat, size, 256)

		plant(t, file, size, 5)
		lazy := &FakeRunner{}
		_, err = Wipe(ctx, dev, PolicyNVMeFormat, WipeOptions{Runner: lazy})
		var ve *VerifyError
		require.ErrorAs(t, err, &ve)
		assert.Empty(t, cmp.Diff(want, lazy.Calls()))
		assert.Equal(t, "head", ve.Findings[0].Kind)
	})
}

// checkProof checks a proof's shape and that its digest is that of the
// zero bytes it sampled.
func checkProof(t testing.TB, p Proof, method Policy, size int64, random int) {
	t.Helper()
	assert.Equal(t, method, p.Method)
	assert.Equal(t, "nvme0n1", p.Device)
	assert.Equal(t, idA.Serial, p.Identity.Serial)
	assert.Equal(t, size, p.Bytes)
	assert.Positive(t, p.VerifyDuration)
	assert.False(t, p.VerifiedAt.IsZero())
	assert.NotZero(t, p.Seed)
	kinds := map[string]int{}
	h := sha256.New()
	for _, s := range p.Samples {
		kinds[s.Kind]++
		h.Write(make([]byte, s.Length))
	}
	assert.Equal(t, random, kinds["random"])
	assert.Equal(t, 1, kinds["head"])
	assert.Equal(t, 1, kinds["tail"])
	last := p.Samples[len(p.Samples)-1]
	assert.Equal(t, size, last.Offset+int64(last.Length), "the tail sample ends at the last byte")
	assert.Equal(t, hex.EncodeToString(h.Sum(nil)), p.SampleDigest)
}

func TestPrivilegedRefuseMountedPartition(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "sgdisk", "partx", "mkfs.ext4", "mount", "umount")
	node, _ := loopDevice(t, 64<<20, false)
	run(t, "sgdisk", "-o", "-n", "1:2048:+32M", "-t", "1:8300", node)
	run(t, "partx", "-a", node)
	run(t, "mkfs.ext4", "-q", node+"p1")
	mnt := t.TempDir()
	run(t, "mount", node+"p1", mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			run(t, "umount", mnt)
		}
	})
	h, dev := simDisk(t, node, true)
	require.Len(t, dev.Partitions, 1)
	before := fileDigest(t, node)
	raw, digest := smallImage(t, 16<<20)

	for name, err := range map[string]error{
		"CheckSafe":       CheckSafe(h.root, dev, idA),
		"CheckSafeToWipe": CheckSafeToWipe(h.root, dev, idA),
		"Clone":           second(Clone(context.Background(), dev, Image{Path: raw, Format: FormatRaw, SHA256: digest}, CloneOptions{})),
		"Wipe":            second(Wipe(context.Background(), dev, PolicyZero, WipeOptions{})),
	} {
		var me *MountedError
		require.ErrorAs(t, err, &me, name)
		assert.Equal(t, MountedError{Device: "nvme0n1", Node: "nvme0n1p1", MountPoint: mnt, FSType: "ext4"}, *me, name)
	}
	assert.Equal(t, before, fileDigest(t, node), "a refused device was modified")
	// The kernel's own guard, used when Clone and Wipe open the disk:
	// no exclusive open of a disk with a mounted partition.
	_, err := openDevice(dev, true)
	require.ErrorContains(t, err, "device or resource busy")
	// A node that no longer is the resolved device is not opened.
	other := dev
	other.Minor++
	_, err = openDevice(other, false)
	require.ErrorContains(t, err, "not "+other.DevT())

	// Unmounted, the partition table is still an unexpected signature
	// for a clone, but is what a wipe removes.
	run(t, "umount", mnt)
	mounted = false
	var se *SignatureError
	require.ErrorAs(t, CheckSafe(h.root, dev, idA), &se)
	assert.Equal(t, []Signature{{Type: "dos", Offset: 0}, {Type: "gpt", Offset: 512}, {Type: "gpt_backup", Offset: 64<<20 - 512},
		{Type: "ext4", Offset: -1, Node: "nvme0n1p1", By: "libblkid"}}, se.Signatures, "the filesystem inside the partition too")
	_, err = Wipe(context.Background(), dev, PolicyZero, WipeOptions{})
	require.NoError(t, err)
	require.NoError(t, CheckSafe(h.root, dev, idA))
}

func second[T any](_ T, err error) error { return err }

func TestPrivilegedRefuseWrongSerial(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	node, file := loopDevice(t, 64<<20, false)
	fillRandom(t, file, 0, 64<<20, 11)
	h, dev := simDisk(t, node, true)
	before := fileDigest(t, node)

	_, err := Resolve(h.root, Identity{Serial: "S6EYNA0T5WRONG"})
	var mm *IdentityMismatchError
	require.ErrorAs(t, err, &mm)

	// The disk behind the name was swapped after resolution.
	h.write(t, h.root.SysPath("class", "block", "nvme0n1", "device", "serial"), "S6EYNA0T5WRONG")
	raw, digest := smallImage(t, 16<<20)
	_, err = Clone(context.Background(), dev, Image{Path: raw, Format: FormatRaw, SHA256: digest}, CloneOptions{})
	require.ErrorAs(t, err, &mm)
	_, err = Wipe(context.Background(), dev, PolicyZero, WipeOptions{})
	require.ErrorAs(t, err, &mm)
	assert.Equal(t, before, fileDigest(t, node))
}

func TestPrivilegedRefuseLVMAndMDSignatures(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "pvcreate", "blkid")
	raw, digest := smallImage(t, 16<<20)

	t.Run("LVM2 physical volume (pvcreate)", func(t *testing.T) {
		node, _ := loopDevice(t, 64<<20, false)
		run(t, "pvcreate", "-ff", "-y", node)
		assert.Contains(t, run(t, "blkid", "-p", node), `TYPE="LVM2_member"`)
		h, dev := simDisk(t, node, true)
		var se *SignatureError
		require.ErrorAs(t, CheckSafe(h.root, dev, idA), &se)
		assert.Equal(t, []Signature{{Type: "LVM2_member", Offset: 512}}, se.Signatures)
		before := fileDigest(t, node)
		_, err := Clone(context.Background(), dev, Image{Path: raw, Format: FormatRaw, SHA256: digest}, CloneOptions{})
		require.ErrorAs(t, err, &se)
		assert.Equal(t, before, fileDigest(t, node))
		// Held by a (simulated) device-mapper volume: not even a wipe.
		h.addHolder(t, "nvme0n1", "", "dm-3")
		_, err = Wipe(context.Background(), dev, PolicyZero, WipeOptions{})
		var he *HeldError
		require.ErrorAs(t, err, &he)
		assert.Equal(t, before, fileDigest(t, node))
	})

	t.Run("MD superblocks 1.2 and 0.90", func(t *testing.T) {
		const size = 64 << 20
		node, file := loopDevice(t, size, false)
		md := binary.LittleEndian.AppendUint32(nil, 0xa92b4efc)
		writeAt(t, file, 4096, md)
		writeAt(t, file, size-64<<10, md)
		h, dev := simDisk(t, node, true)
		var se *SignatureError
		require.ErrorAs(t, CheckSafe(h.root, dev, idA), &se)
		assert.Equal(t, []Signature{{Type: "linux_raid_member", Offset: 4096}, {Type: "linux_raid_member", Offset: size - 64<<10}}, se.Signatures)
		proof, err := Wipe(context.Background(), dev, PolicyDiscard, WipeOptions{})
		require.NoError(t, err)
		assert.Equal(t, PolicyDiscard, proof.Method)
		require.NoError(t, CheckSafe(h.root, dev, idA))
	})
}
