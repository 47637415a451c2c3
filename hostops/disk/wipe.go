package disk

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"time"
)

// Policy is a site's wipe method for released slot disks.
type Policy string

// Wipe policies.
const (
	PolicyDiscard    Policy = "blkdiscard"  // deallocate every block (blkdiscard)
	PolicyNVMeFormat Policy = "nvme-format" // NVMe Format with user-data erase (--ses=1)
	PolicyZero       Policy = "zero"        // write zeroes over the whole device (BLKZEROOUT)
)

// ParsePolicy validates a policy name from configuration.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyDiscard, PolicyNVMeFormat, PolicyZero:
		return p, nil
	}
	return "", fmt.Errorf("wipe policy %q: want %s, %s or %s", s, PolicyDiscard, PolicyNVMeFormat, PolicyZero)
}

// Sample is one range read back by Verify.
type Sample struct {
	Kind   string `json:"kind"` // "head", "tail", "superblock", "random"
	Offset int64  `json:"offset"`
	Length int    `json:"length"`
}

// Proof records a verified wipe; the coordinator stores it on the slot and
// only a slot with a proof returns to available.
type Proof struct {
	Method         Policy        `json:"method"`
	Device         string        `json:"device"`
	Identity       Identity      `json:"identity"` // as read from sysfs at verification
	Bytes          int64         `json:"bytes"`    // device size
	Duration       time.Duration `json:"duration_ns"`
	VerifyDuration time.Duration `json:"verify_duration_ns"`
	Seed           uint64        `json:"seed"`          // of the random sample offsets
	Samples        []Sample      `json:"samples"`       // every range read, in hash order
	SampleDigest   string        `json:"sample_sha256"` // sha256 of the sampled bytes
	VerifiedAt     time.Time     `json:"verified_at"`
}

// VerifyOptions tune Verify. The zero value samples 256 random 64 KiB
// ranges with a fresh random seed.
type VerifyOptions struct {
	Samples     int    // random samples (default 256)
	SampleBytes int    // bytes per random sample, multiple of 4096 (default 64 KiB)
	Seed        uint64 // 0 picks a random seed (recorded in the proof)
	Progress    func(Progress)
}

// WipeOptions tune Wipe.
type WipeOptions struct {
	Runner   Runner // nil means ExecRunner
	Progress func(Progress)
	Verify   VerifyOptions
}

// VerifyError reports what a verification found instead of zeros.
type VerifyError struct {
	Device   string
	Findings []Finding
}

// Finding is one non-zero range.
type Finding struct {
	Kind      string `json:"kind"`
	Offset    int64  `json:"offset"`              // first non-zero byte
	Signature string `json:"signature,omitempty"` // a known format found there
}

func (e *VerifyError) Error() string {
	const show = 5
	var s []string
	for i, f := range e.Findings {
		if i == show {
			s = append(s, fmt.Sprintf("and %d more ranges", len(e.Findings)-show))
			break
		}
		msg := fmt.Sprintf("%s range has data at byte %d", f.Kind, f.Offset)
		if f.Signature != "" {
			msg += " (" + f.Signature + " signature)"
		}
		s = append(s, msg)
	}
	return fmt.Sprintf("wipe verification of %s failed: %s", e.Device, strings.Join(s, "; "))
}

// Wipe erases dev (from Resolve) by policy and verifies the result. The
// device is refused first if it is mounted, held or not the approved disk;
// signatures are expected (that is what is wiped). The returned Proof is
// only valid with a nil error.
func Wipe(ctx context.Context, dev Device, policy Policy, opts WipeOptions) (Proof, error) {
	if err := dev.resolved(); err != nil {
		return Proof{}, err
	}
	if _, err := ParsePolicy(string(policy)); err != nil {
		return Proof{}, err
	}
	if opts.Runner == nil {
		opts.Runner = ExecRunner{}
	}
	if err := CheckSafeToWipe(dev.root, dev, dev.approved); err != nil {
		return Proof{}, err
	}
	t0 := time.Now()
	tr := newTracker("wipe", dev.SizeBytes, opts.Progress)
	var err error
	switch policy {
	case PolicyDiscard:
		// blkdiscard opens the device exclusively itself.
		err = opts.Runner.Run(ctx, nil, "blkdiscard", dev.Path)
	case PolicyNVMeFormat:
		err = opts.Runner.Run(ctx, nil, "nvme", nvmeFormatArgs(dev.Path)...)
	case PolicyZero:
		err = zeroDevice(ctx, dev, tr)
	}
	if err != nil {
		return Proof{}, fmt.Errorf("wipe %s by %s: %w", dev.Name, policy, err)
	}
	if policy != PolicyZero {
		tr.add(dev.SizeBytes) // one command did it all
	}
	tr.finish()
	wiped := time.Since(t0)
	if bd, err := openDevice(dev, false); err == nil {
		if err := bd.rereadPartitions(); err != nil {
			slog.Warn("partition table not re-read after wipe", "disk", dev.Name, "err", err)
		}
		bd.Close()
	}
	proof, err := Verify(ctx, dev, opts.Verify)
	if err != nil {
		return Proof{}, err
	}
	proof.Method = policy
	proof.Duration = wiped
	slog.Info("disk wiped and verified", "disk", dev.Name, "policy", policy, "bytes", proof.Bytes,
		"wipe_s", wiped.Seconds(), "verify_s", proof.VerifyDuration.Seconds(), "samples", len(proof.Samples))
	return proof, nil
}

// nvmeFormatArgs formats the namespace with a user-data erase, keeping the
// current LBA format.
func nvmeFormatArgs(dev string) []string {
	return []string{"format", dev, "--ses=1", "--force"}
}

func zeroDevice(ctx context.Context, dev Device, tr *tracker) error {
	bd, err := openDevice(dev, true)
	if err != nil {
		return err
	}
	defer bd.Close()
	if err := noOtherWriter(dev, bd); err != nil {
		return err
	}
	if err := bd.ZeroRange(ctx, 0, bd.size, tr.add); err != nil {
		return err
	}
	return bd.Sync()
}

// verifyHead and verifyTail are read whole: partition tables, most
// superblocks, the backup GPT (last 33 sectors) and MD 0.90/1.0 live there.
const (
	verifyHead = 1 << 20
	verifyTail = 1 << 20
)

// Verify reads back dev and fails with *VerifyError unless every range it
// reads is zero: the first and last MiB, the classic superblock and
// backup-superblock offsets, and Samples seeded-random ranges across the
// whole device. It returns a proof whose Method is left empty.
func Verify(ctx context.Context, dev Device, opts VerifyOptions) (Proof, error) {
	if err := dev.resolved(); err != nil {
		return Proof{}, err
	}
	if err := CheckSafeToWipe(dev.root, dev, dev.approved); err != nil {
		return Proof{}, err
	}
	fresh, err := readDevice(dev.root, dev.Name)
	if err != nil {
		return Proof{}, fmt.Errorf("verify %s: %w", dev.Name, err)
	}
	if opts, err = verifyOptions(dev.Name, opts); err != nil {
		return Proof{}, err
	}
	t0 := time.Now()
	bd, err := openDevice(dev, false)
	if err != nil {
		return Proof{}, fmt.Errorf("verify %s: %w", dev.Name, err)
	}
	defer bd.Close()
	proof, err := verifyRanges(ctx, dev.Name, bd.size, bd.readFull, opts)
	if err != nil {
		return Proof{}, err
	}
	proof.Identity = fresh.Identity
	proof.VerifyDuration = time.Since(t0)
	return proof, nil
}

// verifyOptions fills opts' defaults and checks them.
func verifyOptions(name string, opts VerifyOptions) (VerifyOptions, error) {
	if opts.Samples == 0 {
		opts.Samples = 256
	}
	if opts.SampleBytes == 0 {
		opts.SampleBytes = 64 << 10
	}
	if opts.Samples < 0 || opts.SampleBytes < 0 || opts.SampleBytes%4096 != 0 {
		return opts, fmt.Errorf("verify %s: %d samples of %d bytes: want positive multiples of 4096", name, opts.Samples, opts.SampleBytes)
	}
	if opts.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		opts.Seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	return opts, nil
}

// verifyRanges reads the sample plan of a device (or file) of size bytes
// through read and fails with *VerifyError unless every range is zero.
func verifyRanges(ctx context.Context, name string, size int64, read func([]byte, int64) error, opts VerifyOptions) (Proof, error) {
	samples := samplePlan(size, opts.Samples, opts.SampleBytes, opts.Seed)
	var total int64
	for _, s := range samples {
		total += int64(s.Length)
	}
	tr := newTracker("verify", total, opts.Progress)
	h := sha256.New()
	buf := alignedBuf(verifyHead)
	var findings []Finding
	for _, s := range samples {
		if err := ctx.Err(); err != nil {
			return Proof{}, fmt.Errorf("verify %s: %w", name, err)
		}
		b := buf[:s.Length]
		if err := read(b, s.Offset); err != nil {
			return Proof{}, fmt.Errorf("verify %s: %w", name, err)
		}
		h.Write(b)
		tr.add(int64(len(b)))
		if i := firstNonZero(b); i >= 0 {
			findings = append(findings, Finding{Kind: s.Kind, Offset: s.Offset + int64(i), Signature: signatureIn(b, s.Offset, size)})
		}
	}
	tr.finish()
	if len(findings) > 0 {
		return Proof{}, &VerifyError{Device: name, Findings: findings}
	}
	return Proof{
		Device:       name,
		Bytes:        size,
		Seed:         opts.Seed,
		Samples:      samples,
		SampleDigest: hex.EncodeToString(h.Sum(nil)),
		VerifiedAt:   time.Now().UTC(),
	}, nil
}

// samplePlan lists the ranges Verify reads on a device of size bytes:
// head, tail, every 4 KiB window holding a known signature or backup
// superblock, and n random ranges of sampleBytes from a seeded generator.
// Ranges are sector-aligned and at most verifyHead long; the tail range
// ends exactly at the last byte.
func samplePlan(size int64, n, sampleBytes int, seed uint64) []Sample {
	const page = 4096
	var out []Sample
	add := func(kind string, off, length int64) {
		off &^= 511 // sector-aligned for O_DIRECT; sizes are whole sectors
		if off < 0 || off >= size {
			return
		}
		length = min(length, size-off, verifyHead)
		length &^= 511
		if length <= 0 {
			return
		}
		out = append(out, Sample{Kind: kind, Offset: off, Length: int(length)})
	}
	add("head", 0, verifyHead)
	// Superblocks and their backups: every probe offset, btrfs mirrors,
	// ext2/3/4 backup superblocks for 1, 2 and 4 KiB blocks (groups 1, 3,
	// 5, 7, 9, 25, 27, 49, 81, 125, 243).
	seen := map[int64]bool{}
	var offs []int64
	for _, p := range probes {
		offs = append(offs, p.at(size)...)
	}
	for _, g := range []int64{1, 3, 5, 7, 9, 25, 27, 49, 81, 125, 243} {
		offs = append(offs, g*8192*1024, g*16384*2048, g*32768*4096)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	for _, o := range offs {
		o &^= page - 1
		if o < verifyHead || o >= size-verifyTail || seen[o] {
			continue // inside head or tail, read anyway
		}
		seen[o] = true
		add("superblock", o, page)
	}
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	if slots := (size - int64(sampleBytes)) / page; slots > 0 {
		for i := 0; i < n; i++ {
			add("random", rng.Int64N(slots+1)*page, int64(sampleBytes))
		}
	}
	if size > verifyHead {
		add("tail", max(verifyHead, size-verifyTail), verifyTail)
	}
	return out
}

func firstNonZero(b []byte) int {
	for i := 0; i < len(b); i += 4096 {
		end := min(i+4096, len(b))
		if allZero(b[i:end]) {
			continue
		}
		for j := i; j < end; j++ {
			if b[j] != 0 {
				return j
			}
		}
	}
	return -1
}
