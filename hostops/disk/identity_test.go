package disk

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	idA = Identity{Serial: "S6EYNA0T500123", WWN: "eui.0025388b91b2c123", EUI: "0025388b91b2c123", Model: "SAMSUNG MZWLR3T8HBLS-00007"}
	idB = Identity{Serial: "S6EYNA0T500456", WWN: "eui.0025388b91b2c456", EUI: "0025388b91b2c456", Model: "SAMSUNG MZWLR3T8HBLS-00007"}
)

// twoDisks is a simulated host with nvme0n1 (idA) and nvme1n1 (idB), both
// pointing at the same real block node (only stat'ed here).
func twoDisks(t *testing.T) (*simHost, string) {
	t.Helper()
	node := anyBlockNode(t)
	h := newSimHost(t, false)
	h.addDisk(t, "nvme0n1", idA, node)
	h.addDisk(t, "nvme1n1", idB, node)
	// A partition entry and an unrelated loop device without identity.
	h.write(t, h.root.SysPath("class", "block", "loop7", "dev"), "7:7")
	h.write(t, h.root.SysPath("class", "block", "loop7", "size"), "0")
	return h, node
}

// Readers, other devices and descriptors that are not files are no open
// writers.
func TestCheckSafeToWipeIgnoresReaders(t *testing.T) {
	t.Parallel()
	h, _ := twoDisks(t)
	dev, err := Resolve(h.root, idA)
	require.NoError(t, err)
	h.openFD(t, 10, "cat", 3, h.node, "0100000") // O_RDONLY|O_LARGEFILE
	h.openFD(t, 11, "sh", 0, "/dev/null", "02")  // O_RDWR on a char device
	require.NoError(t, os.MkdirAll(h.root.ProcPath("12", "fd"), 0o755))
	require.NoError(t, os.Symlink("socket:[1234]", h.root.ProcPath("12", "fd", "4")))
	require.NoError(t, os.MkdirAll(h.root.ProcPath("self"), 0o755)) // not a pid
	h.write(t, h.root.SysPath("block", "loop3", "loop", "backing_file"), "/var/lib/images/x.img (deleted)")
	require.NoError(t, CheckSafeToWipe(h.root, dev, idA))

	// A writer's fdinfo without flags is an error, not a pass.
	h.openFD(t, 13, "odd", 5, h.node, "")
	require.ErrorContains(t, CheckSafeToWipe(h.root, dev, idA), "no flags line")
}

func TestParseBlkidOutput(t *testing.T) {
	t.Parallel()
	disk := "DEVNAME=/dev/fd/3\nUUID=83fe\nTYPE=bcache\nUSAGE=other\nPTUUID=5036\nPTTYPE=gpt\n"
	assert.Equal(t, []Signature{{Type: "bcache", Offset: -1, By: "libblkid"}, {Type: "gpt", Offset: -1, By: "libblkid"}},
		parseBlkidExport([]byte(disk), ""))
	// A partition: its entry in the parent's table is not content; a
	// nested table and a filesystem are.
	part := "DEVNAME=/dev/fd/3\nPTTYPE=bsd\nTYPE=zfs_member\nPART_ENTRY_SCHEME=dos\nPART_ENTRY_TYPE=0xa5\nPART_ENTRY_NUMBER=1\n"
	assert.Equal(t, []Signature{{Type: "bsd", Offset: -1, Node: "nvme0n1p1", By: "libblkid"}, {Type: "zfs_member", Offset: -1, Node: "nvme0n1p1", By: "libblkid"}},
		parseBlkidExport([]byte(part), "nvme0n1p1"))
	assert.Equal(t, "nvme0n1p1:zfs_member (libblkid)", Signature{Type: "zfs_member", Offset: -1, Node: "nvme0n1p1", By: "libblkid"}.String())
	assert.Equal(t, "gpt@512", Signature{Type: "gpt", Offset: 512}.String())

	wipefs := `{"signatures": [{"device":"fd/3","offset":"0xff6","type":"swap","uuid":null,"label":null},
		{"device":"fd/3","offset":"0x438","type":"ext2","uuid":null,"label":null}]}`
	sigs, err := parseWipefsJSON([]byte(wipefs), "")
	require.NoError(t, err)
	assert.Equal(t, []Signature{{Type: "swap", Offset: 0xff6, By: "libblkid"}, {Type: "ext2", Offset: 0x438, By: "libblkid"}}, sigs)
	_, err = parseWipefsJSON([]byte(`{"signatures":[{"offset":"zz","type":"x"}]}`), "")
	require.ErrorContains(t, err, `offset "zz"`)
	sigs, err = parseWipefsJSON(nil, "")
	require.NoError(t, err)
	assert.Empty(t, sigs)
}

func TestResolve(t *testing.T) {
	t.Parallel()
	h, _ := twoDisks(t)
	for _, tc := range []struct {
		name     string
		want     Identity
		wantName string
		wantErr  string
	}{
		{name: "serial", want: Identity{Serial: idB.Serial}, wantName: "nvme1n1"},
		{name: "wwn case and scheme insensitive", want: Identity{WWN: "EUI.0025388B91B2C123"}, wantName: "nvme0n1"},
		{name: "eui without scheme", want: Identity{EUI: "0025388b91b2c456"}, wantName: "nvme1n1"},
		{name: "everything", want: idA, wantName: "nvme0n1"},
		{name: "expected name holds", want: Identity{Serial: idA.Serial, DeviceName: "nvme0n1"}, wantName: "nvme0n1"},
		{name: "disks renumbered", want: Identity{Serial: idA.Serial, DeviceName: "nvme1n1"}, wantErr: "identity now belongs to nvme0n1, not nvme1n1"},
		{name: "wrong serial", want: Identity{Serial: "S6EYNA0T599999"}, wantErr: "no block device carries this identity"},
		{name: "serial of one, eui of the other", want: Identity{Serial: idA.Serial, EUI: idB.EUI}, wantErr: "no block device"},
		{name: "model alone is not an identity", want: Identity{Model: idA.Model}, wantErr: "needs a serial, WWN or EUI"},
		{name: "path traversal in name", want: Identity{Serial: idA.Serial, DeviceName: "../sda"}, wantErr: "not a single path element"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, err := Resolve(h.root, tc.want)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantName, dev.Name)
			assert.Equal(t, h.root.DevPath(tc.wantName), dev.Path)
			assert.Equal(t, idA.Model, dev.Identity.Model)
		})
	}

	// Two disks reporting the same serial (a firmware bug seen in the
	// field) are ambiguous, never "the first one".
	h.write(t, h.root.SysPath("class", "block", "nvme1n1", "device", "serial"), idA.Serial)
	_, err := Resolve(h.root, Identity{Serial: idA.Serial})
	var mm *IdentityMismatchError
	require.ErrorAs(t, err, &mm)
	assert.Contains(t, err.Error(), "ambiguous, matched nvme0n1, nvme1n1")
}

func TestResolveFindsNodeByDeviceNumber(t *testing.T) {
	t.Parallel()
	h, node := twoDisks(t)
	// /dev/nvme0n1 missing: found through /dev/block/MAJ:MIN.
	require.NoError(t, os.Remove(h.root.DevPath("nvme0n1")))
	_, err := Resolve(h.root, Identity{Serial: idA.Serial})
	var mm *IdentityMismatchError
	require.NotErrorAs(t, err, &mm)
	require.NoError(t, os.Remove(h.root.DevPath("nvme1n1")))
	_, err = Resolve(h.root, Identity{Serial: idA.Serial})
	require.ErrorContains(t, err, "no block device node")
	devt, _ := nodeInfo(t, node)
	require.NoError(t, os.MkdirAll(h.root.DevPath("block"), 0o755))
	require.NoError(t, os.Symlink(node, h.root.DevPath("block", devt)))
	dev, err := Resolve(h.root, Identity{Serial: idA.Serial})
	require.NoError(t, err)
	assert.Equal(t, h.root.DevPath("block", devt), dev.Path)

	// A regular file with the right name is not a device node.
	require.NoError(t, os.Remove(h.root.DevPath("block", devt)))
	require.NoError(t, os.WriteFile(h.root.DevPath("nvme0n1"), nil, 0o644))
	_, err = Resolve(h.root, Identity{Serial: idA.Serial})
	require.ErrorContains(t, err, "no block device node")
}

// CheckSafe refusals that need no I/O on the device: they are decided from
// sysfs and procfs alone, before the device is opened.
func TestCheckSafeRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, h *simHost)
		check func(t *testing.T, err error)
	}{
		{"partition mounted (by device number)", func(t *testing.T, h *simHost) {
			h.addPartition(t, "nvme0n1", 1, "259:17")
			h.write(t, h.root.ProcPath("self", "mountinfo"),
				"22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n43 22 259:17 / /srv/share rw,relatime shared:9 - ext4 /dev/nvme0n1p1 rw")
		}, func(t *testing.T, err error) {
			var me *MountedError
			require.ErrorAs(t, err, &me)
			assert.Equal(t, MountedError{Device: "nvme0n1", Node: "nvme0n1p1", MountPoint: "/srv/share", FSType: "ext4"}, *me)
			assert.Contains(t, err.Error(), "refusing disk nvme0n1: partition nvme0n1p1: mounted on /srv/share (ext4)")
		}},
		{"btrfs mounted (anonymous device number, by source)", func(t *testing.T, h *simHost) {
			h.addPartition(t, "nvme0n1", 2, "259:18")
			h.write(t, h.root.ProcPath("self", "mountinfo"), "50 22 0:45 / /data rw - btrfs /dev/nvme0n1p2 rw,ssd")
		}, func(t *testing.T, err error) {
			var me *MountedError
			require.ErrorAs(t, err, &me)
			assert.Equal(t, "nvme0n1p2", me.Node)
		}},
		{"whole disk mounted", func(t *testing.T, h *simHost) {
			devt, _ := os.ReadFile(h.root.SysPath("class", "block", "nvme0n1", "dev"))
			h.write(t, h.root.ProcPath("self", "mountinfo"), "43 22 "+string(devt[:len(devt)-1])+" / /mnt rw - xfs /dev/nvme0n1 rw")
		}, func(t *testing.T, err error) {
			var me *MountedError
			require.ErrorAs(t, err, &me)
			assert.Equal(t, "nvme0n1", me.Node)
		}},
		{"swap partition", func(t *testing.T, h *simHost) {
			h.addPartition(t, "nvme0n1", 3, "259:19")
			h.write(t, h.root.ProcPath("swaps"), "Filename Type Size Used Priority\n/dev/nvme0n1p3 partition 8388604 0 -2")
		}, func(t *testing.T, err error) {
			var me *MountedError
			require.ErrorAs(t, err, &me)
			assert.Equal(t, "[swap]", me.MountPoint)
		}},
		{"lvm holder on a partition", func(t *testing.T, h *simHost) {
			h.addPartition(t, "nvme0n1", 1, "259:17")
			h.addHolder(t, "nvme0n1", "nvme0n1p1", "dm-0")
		}, func(t *testing.T, err error) {
			var he *HeldError
			require.ErrorAs(t, err, &he)
			assert.Equal(t, HeldError{Device: "nvme0n1", Node: "nvme0n1p1", Holders: []string{"dm-0"}}, *he)
		}},
		{"md holder on the disk", func(t *testing.T, h *simHost) {
			h.addHolder(t, "nvme0n1", "", "md127")
		}, func(t *testing.T, err error) {
			var he *HeldError
			require.ErrorAs(t, err, &he)
			assert.Contains(t, err.Error(), "held by md127")
		}},
		{"serial changed since resolve (disk swapped)", func(t *testing.T, h *simHost) {
			h.write(t, h.root.SysPath("class", "block", "nvme0n1", "device", "serial"), "S6EYNA0T5REPLACED")
		}, func(t *testing.T, err error) {
			var mm *IdentityMismatchError
			require.ErrorAs(t, err, &mm)
			assert.Contains(t, err.Error(), `disk nvme0n1 is not the approved disk`)
			assert.Contains(t, err.Error(), `serial is "S6EYNA0T5REPLACED"`)
		}},
		{"device number changed", func(t *testing.T, h *simHost) {
			h.write(t, h.root.SysPath("class", "block", "nvme0n1", "dev"), "259:99")
		}, func(t *testing.T, err error) {
			var mm *IdentityMismatchError
			require.ErrorAs(t, err, &mm)
			assert.Contains(t, err.Error(), "device number changed")
		}},
		{"open for writing by a process (no O_EXCL)", func(t *testing.T, h *simHost) {
			h.openFD(t, 4242, "dd", 3, h.node, "0100002") // O_RDWR|O_LARGEFILE
		}, func(t *testing.T, err error) {
			var ow *OpenWriterError
			require.ErrorAs(t, err, &ow)
			assert.Equal(t, OpenWriterError{Device: "nvme0n1", Node: "nvme0n1", PID: 4242, Command: "dd", FD: 3}, *ow)
			assert.Contains(t, err.Error(), "refusing disk nvme0n1: nvme0n1 is open for writing by pid 4242 (dd, fd 3)")
		}},
		{"open write-only", func(t *testing.T, h *simHost) {
			h.openFD(t, 77, "fio", 9, h.node, "02100001") // O_WRONLY|O_DIRECT|O_LARGEFILE
		}, func(t *testing.T, err error) {
			var ow *OpenWriterError
			require.ErrorAs(t, err, &ow)
			assert.Equal(t, 77, ow.PID)
		}},
		{"backs a loop device", func(t *testing.T, h *simHost) {
			h.write(t, h.root.SysPath("block", "loop9", "loop", "backing_file"), h.node)
		}, func(t *testing.T, err error) {
			var ow *OpenWriterError
			require.ErrorAs(t, err, &ow)
			assert.Equal(t, "loop9", ow.Loop)
			assert.Contains(t, err.Error(), "nvme0n1 backs loop device loop9")
		}},
		{"read-only", func(t *testing.T, h *simHost) {
			h.write(t, h.root.SysPath("class", "block", "nvme0n1", "ro"), "1")
		}, func(t *testing.T, err error) {
			var ro *ReadOnlyError
			require.ErrorAs(t, err, &ro)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, _ := twoDisks(t)
			dev, err := Resolve(h.root, idA)
			require.NoError(t, err)
			tc.setup(t, h)
			tc.check(t, CheckSafe(h.root, dev, idA))
			tc.check(t, CheckSafeToWipe(h.root, dev, idA))

			// Wipe and Clone refuse before running anything.
			fake := &FakeRunner{}
			_, err = Wipe(context.Background(), dev, PolicyNVMeFormat, WipeOptions{Runner: fake})
			tc.check(t, err)
			_, err = Clone(context.Background(), dev, Image{Path: "/nonexistent", Format: FormatQCOW2, SHA256: zeroDigest}, CloneOptions{Runner: fake})
			require.Error(t, err)
			assert.Empty(t, fake.Calls(), "nothing may run against a refused disk")
		})
	}
}

const zeroDigest = "0000000000000000000000000000000000000000000000000000000000000000"

func TestUnresolvedDeviceRefused(t *testing.T) {
	t.Parallel()
	dev := Device{Name: "nvme0n1", Path: "/dev/nvme0n1"}
	_, err := Wipe(context.Background(), dev, PolicyZero, WipeOptions{Runner: &FakeRunner{}})
	require.ErrorContains(t, err, "not resolved from an approved identity")
	_, err = Clone(context.Background(), dev, Image{}, CloneOptions{})
	require.ErrorContains(t, err, "not resolved")
	_, err = Verify(context.Background(), dev, VerifyOptions{})
	require.ErrorContains(t, err, "not resolved")
}

func TestPolicyAndJSON(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{PolicyDiscard, PolicyNVMeFormat, PolicyZero} {
		got, err := ParsePolicy(string(p))
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	_, err := ParsePolicy("shred")
	require.ErrorContains(t, err, "want blkdiscard, nvme-format or zero")

	b, err := json.Marshal(Identity{Serial: "S1", EUI: "00ab"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"serial":"S1","eui":"00ab"}`, string(b))

	h, _ := twoDisks(t)
	dev, err := Resolve(h.root, idA)
	require.NoError(t, err)
	b, err = json.Marshal(dev)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "approved", "unexported resolve state stays out of JSON")
}
