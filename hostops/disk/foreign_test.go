package disk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeZFSLabels writes the four vdev labels ZFS keeps on a pool member
// (256 KiB each: two at the start, two at the 256 KiB-aligned end), with
// the uberblock ring zpool fills at +128 KiB: 1 KiB uberblocks starting
// with ub_magic 0x00bab10c, ub_version, ub_txg, ub_guid_sum and
// ub_timestamp, little-endian as on x86. (zfsutils is not packaged for
// this distribution's main archive; these are the bytes it writes that
// libblkid's zfs prober reads.)
func writeZFSLabels(t testing.TB, file string, size int64) {
	t.Helper()
	const label, ring, ub = 256 << 10, 128 << 10, 1 << 10
	end := size - size%label
	for _, l := range []int64{0, label, end - 2*label, end - label} {
		buf := make([]byte, label-ring)
		for i := 0; i < 32; i++ {
			u := buf[i*ub:]
			binary.LittleEndian.PutUint64(u[0:], 0x00bab10c)            // ub_magic
			binary.LittleEndian.PutUint64(u[8:], 5000)                  // ub_version (SPA_VERSION_FEATURES)
			binary.LittleEndian.PutUint64(u[16:], uint64(4+i))          // ub_txg
			binary.LittleEndian.PutUint64(u[24:], 0x5eed5eed5eed)       // ub_guid_sum
			binary.LittleEndian.PutUint64(u[32:], 1764000000+uint64(i)) // ub_timestamp
		}
		writeAt(t, file, l+ring, buf)
	}
}

// Signatures the built-in magic scan never knew are refused through
// libblkid, each written the way its tool writes it; the device is not
// changed by CheckSafe nor by the refused Clone.
func TestPrivilegedRefuseForeignSignatures(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "blkid", "wipefs", "cryptsetup", "make-bcache", "mkswap", "mkfs.ext4")
	raw, digest := smallImage(t, 16<<20)
	const size = 64 << 20
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, node, file string)
		blkid string // TYPE blkid -p reports ("" = ambivalent)
		want  []string
	}{
		{"ZFS pool member", func(t *testing.T, node, file string) { writeZFSLabels(t, file, size) },
			"zfs_member", []string{"zfs_member"}},
		{"bcache backing device (make-bcache -B)", func(t *testing.T, node, file string) {
			// Where the kernel has bcache, udev may register the backing
			// device at once: stop it again so the loop device detaches.
			stop := filepath.Join("/sys/block", filepath.Base(node), "bcache", "stop")
			t.Cleanup(func() { _ = os.WriteFile(stop, []byte("1"), 0o200) })
			run(t, "make-bcache", "-B", node)
		}, "bcache", []string{"bcache"}},
		{"LUKS2 (cryptsetup luksFormat)", func(t *testing.T, node, file string) {
			cmd := exec.Command("cryptsetup", "luksFormat", "-q", "--type", "luks2", "--pbkdf", "pbkdf2",
				"--pbkdf-force-iterations", "1000", "--key-file", "-", node)
			cmd.Stdin = strings.NewReader("passphrase")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
		}, "crypto_LUKS", []string{"crypto_LUKS"}},
		{"Ceph BlueStore OSD", func(t *testing.T, node, file string) {
			writeAt(t, file, 0, []byte("bluestore block device\n6a5b5a14-6cf2-4ab7-b9a0-2b2e5f0b3c7e\n"))
		}, "ceph_bluestore", []string{"ceph_bluestore"}},
		{"swap over an old ext2 superblock (ambivalent)", func(t *testing.T, node, file string) {
			run(t, "mkswap", node)
			writeAt(t, file, 1080, []byte{0x53, 0xef})
		}, "", []string{"swap", "ext4", "ext2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node, file := loopDevice(t, size, false)
			tc.write(t, node, file)
			out, err := exec.Command("blkid", "-p", "-o", "export", node).CombinedOutput()
			if tc.blkid != "" {
				require.NoError(t, err, "%s", out)
				assert.Contains(t, string(out), "TYPE="+tc.blkid+"\n", "blkid -p identifies it")
			} else {
				assert.Contains(t, string(out), "ambivalent")
			}
			h, dev := simDisk(t, node, true)
			before := fileDigest(t, node)

			var se *SignatureError
			require.ErrorAs(t, CheckSafe(h.root, dev, idA), &se)
			var types []string
			for _, s := range se.Signatures {
				types = append(types, s.Type)
			}
			assert.ElementsMatch(t, tc.want, types, "%v", se.Signatures)
			assert.Contains(t, se.Error(), "refusing disk nvme0n1: unexpected signatures")
			_, err = Clone(context.Background(), dev, Image{Path: raw, Format: FormatRaw, SHA256: digest}, CloneOptions{})
			require.ErrorAs(t, err, &se)
			assert.Equal(t, before, fileDigest(t, node), "a refused device was modified")

			// Wiped, the same disk is accepted.
			_, err = Wipe(context.Background(), dev, PolicyZero, WipeOptions{Verify: VerifyOptions{Samples: 16}})
			require.NoError(t, err)
			require.NoError(t, CheckSafe(h.root, dev, idA))
		})
	}
}

// holdOpen starts a child process that opens path with the shell
// redirection redir ("<>" read-write without O_EXCL, "<" read-only) as
// its fd 3 and waits; it is killed in Cleanup.
func holdOpen(t testing.TB, path, redir string) int {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command("sh", "-c", fmt.Sprintf("exec 3%s%s && touch %s && exec sleep 600", redir, path, ready))
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	require.Eventually(t, func() bool { _, err := os.Stat(ready); return err == nil }, 10*time.Second, 10*time.Millisecond)
	// After the exec the shell is sleep: the same pid, comm "sleep".
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		return strings.TrimSpace(string(b)) == "sleep"
	}, 10*time.Second, 10*time.Millisecond)
	return cmd.Process.Pid
}

// A process holding the disk, or one of its partitions, open read-write
// without O_EXCL (which the kernel's exclusive-open guard does not see)
// is refused by name; a reader is not.
func TestPrivilegedRefuseOpenWriter(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	testenv.Commands(t, "sgdisk", "partx", "sh", "sleep")
	raw, digest := smallImage(t, 16<<20)

	t.Run("disk", func(t *testing.T) {
		t.Parallel()
		node, file := loopDevice(t, 64<<20, false)
		fillRandom(t, file, 0, 64<<20, 21) // random bytes: no signature
		h, dev := simDisk(t, node, true)
		before := fileDigest(t, node)

		reader := holdOpen(t, node, "<")
		require.NoError(t, CheckSafe(h.root, dev, idA), "a reader (pid %d) is no writer", reader)

		pid := holdOpen(t, node, "<>")
		want := OpenWriterError{Device: "nvme0n1", Node: "nvme0n1", PID: pid, Command: "sleep", FD: 3}
		for name, err := range map[string]error{
			"CheckSafe":       CheckSafe(h.root, dev, idA),
			"CheckSafeToWipe": CheckSafeToWipe(h.root, dev, idA),
			"Clone":           second(Clone(context.Background(), dev, Image{Path: raw, Format: FormatRaw, SHA256: digest}, CloneOptions{})),
			"Wipe":            second(Wipe(context.Background(), dev, PolicyZero, WipeOptions{})),
		} {
			var ow *OpenWriterError
			require.ErrorAs(t, err, &ow, name)
			assert.Equal(t, want, *ow, name)
			assert.Contains(t, err.Error(), fmt.Sprintf("refusing disk nvme0n1: nvme0n1 is open for writing by pid %d (sleep, fd 3)", pid), name)
		}
		assert.Equal(t, before, fileDigest(t, node), "a refused device was modified")
		// The kernel's own guard lets this writer through: only the
		// descriptor scan catches it.
		// Clone's re-check once it holds the disk exclusively: its own
		// descriptor is not a writer to refuse, the other one is.
		bd, err := openDevice(dev, true)
		require.NoError(t, err, "O_EXCL does not see a non-exclusive writer")
		var ow *OpenWriterError
		require.ErrorAs(t, noOtherWriter(dev, bd), &ow)
		assert.Equal(t, pid, ow.PID)
		require.NoError(t, bd.Close())
	})

	t.Run("partition", func(t *testing.T) {
		t.Parallel()
		node, _ := loopDevice(t, 64<<20, false)
		run(t, "sgdisk", "-o", "-n", "1:2048:+32M", "-t", "1:8300", node)
		run(t, "partx", "-a", node)
		h, dev := simDisk(t, node, true)
		require.Len(t, dev.Partitions, 1)
		before := fileDigest(t, node)
		pid := holdOpen(t, node+"p1", "<>")
		for name, err := range map[string]error{
			"CheckSafeToWipe": CheckSafeToWipe(h.root, dev, idA),
			"Wipe":            second(Wipe(context.Background(), dev, PolicyDiscard, WipeOptions{})),
		} {
			var ow *OpenWriterError
			require.ErrorAs(t, err, &ow, name)
			assert.Equal(t, OpenWriterError{Device: "nvme0n1", Node: "nvme0n1p1", PID: pid, Command: "sleep", FD: 3}, *ow, name)
		}
		assert.Equal(t, before, fileDigest(t, node), "a refused device was modified")
	})
}

// A partition sysfs lists but whose node cannot be probed fails the check
// on a blank disk, and does not hide the disk's own signatures.
func TestPrivilegedUnprobedPartition(t *testing.T) {
	t.Parallel()
	testenv.Root(t)
	node, file := loopDevice(t, 64<<20, false)
	h, _ := simDisk(t, node, true)
	h.addPartition(t, "nvme0n1", 1, "259:250") // no node under /dev
	dev, err := Resolve(h.root, idA)
	require.NoError(t, err)
	err = CheckSafe(h.root, dev, idA)
	require.ErrorContains(t, err, "check disk nvme0n1: partition nvme0n1p1: open block device")
	var se *SignatureError
	require.False(t, errors.As(err, &se))

	writeAt(t, file, 512, append(append([]byte("LABELONE"), make([]byte, 16)...), "LVM2 001"...))
	require.ErrorAs(t, CheckSafe(h.root, dev, idA), &se)
	assert.Equal(t, "LVM2_member", se.Signatures[0].Type)
}
