package disk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gpuaas/gpuaas/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseMountinfo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      string
		want    []MountEntry
		wantErr string
	}{
		{name: "empty", in: ""},
		{
			name: "proc(5) example with optional fields",
			in:   "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n",
			want: []MountEntry{{Major: 98, Minor: 0, Root: "/mnt1", MountPoint: "/mnt2", FSType: "ext3", Source: "/dev/root"}},
		},
		{
			name: "no optional fields, escaped space",
			in:   "43 27 259:0 / /tmp/cap\\040mnt rw,relatime - ext4 /dev/loop0p1 rw\n",
			want: []MountEntry{{Major: 259, Minor: 0, Root: "/", MountPoint: "/tmp/cap mnt", FSType: "ext4", Source: "/dev/loop0p1"}},
		},
		{
			name: "several optional fields",
			in:   "50 29 0:45 / /var/lib/x rw shared:5 master:2 propagate_from:1 - btrfs /dev/nvme1n1p2 rw,ssd\n",
			want: []MountEntry{{Major: 0, Minor: 45, Root: "/", MountPoint: "/var/lib/x", FSType: "btrfs", Source: "/dev/nvme1n1p2"}},
		},
		{name: "truncated", in: "36 35 98:0 /mnt1 /mnt2\n", wantErr: "line 1: malformed"},
		{name: "no separator", in: "36 35 98:0 /mnt1 /mnt2 rw a b c d e\n", wantErr: "malformed"},
		{name: "bad devt", in: "36 35 98 /mnt1 /mnt2 rw - ext3 /dev/root rw\n", wantErr: "not major:minor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMountinfo(tc.in)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Empty(t, cmp.Diff(tc.want, got))
		})
	}
}

// The capture is this machine's /proc/self/mountinfo with an ext4
// partition of a loop device mounted on a path with a space.
func TestParseMountinfoCapture(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/mountinfo-loop-partition.txt")
	require.NoError(t, err)
	ms, err := ParseMountinfo(string(b))
	require.NoError(t, err)
	require.Greater(t, len(ms), 10)
	var found *MountEntry
	for i := range ms {
		if ms[i].MountPoint == "/tmp/cap mnt" {
			found = &ms[i]
		}
	}
	require.NotNil(t, found)
	assert.Equal(t, MountEntry{Major: 259, Minor: 0, Root: "/", MountPoint: "/tmp/cap mnt", FSType: "ext4", Source: "/dev/loop0p1"}, *found)
	assert.Equal(t, MountEntry{Major: 0, Minor: 21, Root: "/", MountPoint: "/proc", FSType: "proc", Source: "proc"}, ms[0])
}

func TestParseSwaps(t *testing.T) {
	t.Parallel()
	in := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/nvme0n1p3                          partition\t8388604\t\t0\t\t-2\n/swap\\040file file 1024 0 -3\n"
	assert.Equal(t, []string{"/dev/nvme0n1p3", "/swap file"}, parseSwaps(in))
	assert.Empty(t, parseSwaps("Filename\tType\tSize\tUsed\tPriority\n"))
}

func TestParseQemu(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"    (0.00/100%)": 0, "(45.50/100%)": 45.5, "    (100.00/100%)": 100} {
		got, ok := parseQemuPercent(in)
		assert.True(t, ok, in)
		assert.InDelta(t, want, got, 1e-9, in)
	}
	for _, bad := range []string{"", "(x/100%)", "(101/100%)", "45%"} {
		_, ok := parseQemuPercent(bad)
		assert.False(t, ok, bad)
	}
	info, err := parseQemuImgInfo([]byte(`{"virtual-size": 10737418240, "filename": "a.qcow2", "format": "qcow2", "actual-size": 200704, "dirty-flag": false}`))
	require.NoError(t, err)
	assert.Equal(t, qemuImgInfo{VirtualSize: 10 << 30, Format: "qcow2"}, info)
	info, err = parseQemuImgInfo([]byte(`{"virtual-size": 1048576, "format": "qcow2", "backing-filename": "/dev/nvme1n1"}`))
	require.NoError(t, err)
	assert.Equal(t, "/dev/nvme1n1", info.BackingFile)
	_, err = parseQemuImgInfo([]byte(`{"format": "raw"}`))
	assert.ErrorContains(t, err, "virtual-size")
	_, err = parseQemuImgInfo([]byte(`not json`))
	assert.Error(t, err)

	// The progress writer turns percentages into bytes, across split writes.
	var got []Progress
	tr := newTracker("write", 1000, func(p Progress) { got = append(got, p) })
	tr.every = 0
	q := &qemuProgress{total: 1000, tr: tr}
	for _, chunk := range []string{"    (0.00/100%)\r    (25.", "00/100%)\r", "    (100.00/100%)\r"} {
		_, _ = q.Write([]byte(chunk))
	}
	require.NotEmpty(t, got)
	assert.Equal(t, int64(250), got[0].Done)
	assert.Equal(t, int64(1000), got[len(got)-1].Done)
}

func TestExtentsAndGaps(t *testing.T) {
	t.Parallel()
	data := alignExtents([]extent{{0, 4096}, {8192, 100}, {8300, 10}, {1 << 20, 4096}, {(1 << 20) + 4096, 513}}, 512)
	assert.Equal(t, []extent{{0, 4096}, {8192, 512}, {1 << 20, 4096 + 1024}}, data)
	assert.Equal(t, []extent{{4096, 4096}, {8704, (1 << 20) - 8704}, {(1 << 20) + 5120, (2 << 20) - (1 << 20) - 5120}}, gaps(data, 2<<20))
	assert.Equal(t, []extent{{0, 1 << 20}}, gaps(nil, 1<<20))
	assert.Empty(t, gaps([]extent{{0, 1 << 20}}, 1<<20))
}

func TestSamplePlan(t *testing.T) {
	t.Parallel()
	size := int64(10<<30) + 512*7 // not 4 KiB aligned: the tail must still end at the last byte
	plan := samplePlan(size, 100, 64<<10, 42)
	require.Equal(t, plan, samplePlan(size, 100, 64<<10, 42), "same seed, same plan")
	assert.NotEqual(t, plan, samplePlan(size, 100, 64<<10, 43))
	assert.Equal(t, Sample{Kind: "head", Offset: 0, Length: 1 << 20}, plan[0])
	last := plan[len(plan)-1]
	assert.Equal(t, "tail", last.Kind)
	assert.Equal(t, size, last.Offset+int64(last.Length))
	assert.GreaterOrEqual(t, int64(last.Length), int64(1<<20)-511)
	kinds := map[string]int{}
	for _, s := range plan {
		kinds[s.Kind]++
		assert.Zero(t, s.Offset%512)
		assert.Zero(t, s.Length%512)
		assert.LessOrEqual(t, s.Offset+int64(s.Length), size)
	}
	assert.Equal(t, 100, kinds["random"])
	assert.Greater(t, kinds["superblock"], 5) // btrfs mirror at 64 MiB, ext backups...
	// A device smaller than the head is read whole.
	small := samplePlan(64<<10, 3, 4096, 1)
	assert.Equal(t, Sample{Kind: "head", Offset: 0, Length: 64 << 10}, small[0])
}

// sigImage builds an in-memory device of size bytes with b written at off.
func sigImage(size int64, writes map[int64][]byte) *bytes.Reader {
	img := make([]byte, size)
	for off, b := range writes {
		copy(img[off:], b)
	}
	return bytes.NewReader(img)
}

func TestScanSignatures(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	mbr := make([]byte, 512)
	mbr[446+4] = 0x83
	mbr[510], mbr[511] = 0x55, 0xaa
	protective := make([]byte, 512)
	protective[446+4] = 0xee
	protective[510], protective[511] = 0x55, 0xaa
	md := binary.LittleEndian.AppendUint32(nil, 0xa92b4efc)
	lvm := append([]byte("LABELONE"), make([]byte, 16)...)
	lvm = append(lvm, "LVM2 001"...)
	for _, tc := range []struct {
		name   string
		writes map[int64][]byte
		want   []Signature
	}{
		{"blank", nil, nil},
		{"random junk is no signature", map[int64][]byte{0: bytes.Repeat([]byte{0xa5}, 70000)}, nil},
		{"gpt with protective mbr and backup", map[int64][]byte{0: protective, 512: []byte("EFI PART"), size - 512: []byte("EFI PART")},
			[]Signature{{Type: "dos", Offset: 0}, {Type: "gpt", Offset: 512}, {Type: "gpt_backup", Offset: size - 512}}},
		{"only the backup gpt", map[int64][]byte{size - 512: []byte("EFI PART")}, []Signature{{Type: "gpt_backup", Offset: size - 512}}},
		{"dos", map[int64][]byte{0: mbr}, []Signature{{Type: "dos", Offset: 0}}},
		{"ext4", map[int64][]byte{1080: {0x53, 0xef}}, []Signature{{Type: "ext4", Offset: 1080}}},
		{"xfs", map[int64][]byte{0: []byte("XFSB")}, []Signature{{Type: "xfs", Offset: 0}}},
		{"btrfs", map[int64][]byte{65600: []byte("_BHRfS_M")}, []Signature{{Type: "btrfs", Offset: 65600}}},
		{"swap", map[int64][]byte{4086: []byte("SWAPSPACE2")}, []Signature{{Type: "swap", Offset: 4086}}},
		{"lvm2 label in sector 1", map[int64][]byte{512: lvm}, []Signature{{Type: "LVM2_member", Offset: 512}}},
		{"md 1.2", map[int64][]byte{4096: md}, []Signature{{Type: "linux_raid_member", Offset: 4096}}},
		{"md 0.90 at the end", map[int64][]byte{size - 64<<10: md}, []Signature{{Type: "linux_raid_member", Offset: size - 64<<10}}},
		{"md 1.0 at the end", map[int64][]byte{size - 8192: md}, []Signature{{Type: "linux_raid_member", Offset: size - 8192}}},
		{"luks", map[int64][]byte{0: []byte("LUKS\xba\xbe")}, []Signature{{Type: "crypto_LUKS", Offset: 0}}},
		{"iso9660", map[int64][]byte{32769: []byte("CD001")}, []Signature{{Type: "iso9660", Offset: 32769}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := scanSignatures(sigImage(size, tc.writes), size)
			require.NoError(t, err)
			assert.Empty(t, cmp.Diff(tc.want, got))
		})
	}
}

// Signatures written by the real tools (on plain files: no root needed)
// are found.
func TestScanSignaturesRealTools(t *testing.T) {
	t.Parallel()
	testenv.Commands(t, "mkfs.ext4", "mkswap", "sgdisk")
	const size = 64 << 20
	for _, tc := range []struct {
		name string
		cmd  []string
		want []string
	}{
		{"mkfs.ext4", []string{"mkfs.ext4", "-q", "-F"}, []string{"ext4"}},
		{"mkswap", []string{"mkswap"}, []string{"swap"}},
		{"sgdisk", []string{"sgdisk", "-o", "-n", "1:2048:0"}, []string{"dos", "gpt", "gpt_backup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), "f")
			require.NoError(t, os.WriteFile(p, nil, 0o644))
			require.NoError(t, os.Truncate(p, size))
			out, err := exec.Command(tc.cmd[0], append(tc.cmd[1:], p)...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			f, err := os.Open(p)
			require.NoError(t, err)
			defer f.Close()
			sigs, err := scanSignatures(f, size)
			require.NoError(t, err)
			var types []string
			for _, s := range sigs {
				types = append(types, s.Type)
			}
			assert.Equal(t, tc.want, types)
		})
	}
}

func TestSignatureIn(t *testing.T) {
	t.Parallel()
	const size = 1 << 30
	buf := make([]byte, 1<<20)
	copy(buf[len(buf)-512:], "EFI PART")
	assert.Equal(t, "gpt_backup", signatureIn(buf, size-int64(len(buf)), size))
	assert.Equal(t, "", signatureIn(make([]byte, 4096), 4096, size))
}

func TestAllZero(t *testing.T) {
	t.Parallel()
	b := make([]byte, 10000)
	assert.True(t, allZero(b))
	assert.Equal(t, -1, firstNonZero(b))
	b[9999] = 1
	assert.False(t, allZero(b))
	assert.Equal(t, 9999, firstNonZero(b))
	b[9999], b[3] = 0, 7
	assert.Equal(t, 3, firstNonZero(b))
	assert.True(t, allZero(nil))
}

func TestTracker(t *testing.T) {
	t.Parallel()
	var got []Progress
	tr := newTracker("write", 1000, func(p Progress) { got = append(got, p) })
	tr.start = tr.start.Add(-2 * time.Second) // 2 s in
	tr.every = 0
	tr.add(250)
	require.Len(t, got, 1)
	p := got[0]
	assert.Equal(t, "write", p.Phase)
	assert.Equal(t, int64(250), p.Done)
	assert.InDelta(t, 125, p.BytesPerSec, 5)
	assert.InDelta(t, 6*time.Second, p.ETA, float64(300*time.Millisecond))
	tr.add(750)
	tr.finish()
	last := got[len(got)-1]
	assert.Equal(t, last.Total, last.Done)
	assert.Zero(t, last.ETA)
	var nilTracker *tracker
	nilTracker.add(1) // a nil tracker is a no-op
	nilTracker.finish()
}

// The proof is what the coordinator stores on a slot: its JSON names are
// part of the contract.
func TestProofJSON(t *testing.T) {
	t.Parallel()
	p := Proof{
		Method: PolicyDiscard, Device: "nvme3n1", Identity: Identity{Serial: "S1", DeviceName: "nvme3n1"},
		Bytes: 3840755982336, Duration: 1500 * time.Millisecond, VerifyDuration: time.Second, Seed: 7,
		Samples:      []Sample{{Kind: "head", Offset: 0, Length: 1 << 20}},
		SampleDigest: "ab", VerifiedAt: time.Date(2026, 11, 21, 19, 0, 0, 0, time.UTC),
	}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	assert.JSONEq(t, `{"method":"blkdiscard","device":"nvme3n1","identity":{"serial":"S1","device_name":"nvme3n1"},
		"bytes":3840755982336,"duration_ns":1500000000,"verify_duration_ns":1000000000,"seed":7,
		"samples":[{"kind":"head","offset":0,"length":1048576}],"sample_sha256":"ab","verified_at":"2026-11-21T19:00:00Z"}`, string(b))
	var back Proof
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Empty(t, cmp.Diff(p, back))
}

func TestVerifyErrorMessage(t *testing.T) {
	t.Parallel()
	e := &VerifyError{Device: "nvme0n1", Findings: []Finding{{Kind: "tail", Offset: 1<<30 - 512, Signature: "gpt_backup"}}}
	assert.Equal(t, "wipe verification of nvme0n1 failed: tail range has data at byte 1073741312 (gpt_backup signature)", e.Error())
	for i := 0; i < 7; i++ {
		e.Findings = append(e.Findings, Finding{Kind: "random", Offset: int64(i) << 20})
	}
	assert.Contains(t, e.Error(), "; and 3 more ranges")
}

// Hashing skips reading holes but must equal hashing every byte.
func TestFileSHA256Sparse(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "sparse.raw")
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	require.NoError(t, os.Truncate(p, 64<<20+1234))
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	for _, off := range []int64{0, 5 << 20, 17<<20 + 3, 64<<20 + 1000} {
		_, err := f.WriteAt(bytes.Repeat([]byte{byte(off), 0xa5}, 100), off)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	want := sha256.Sum256(b)
	var last Progress
	tr := newTracker("digest", int64(len(b)), func(p Progress) { last = p })
	got, err := fileSHA256(context.Background(), p, tr)
	require.NoError(t, err)
	assert.Equal(t, want[:], got)
	assert.Equal(t, int64(len(b)), last.Done)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = fileSHA256(ctx, p, nil)
	assert.ErrorIs(t, err, context.Canceled)
}
