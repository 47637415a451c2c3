package disk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Signature is an on-disk format marker found on a device.
type Signature struct {
	Type   string `json:"type"`           // "gpt", "dos", "ext4", "zfs_member", "bcache", "crypto_LUKS", "ceph_bluestore", ...
	Offset int64  `json:"offset"`         // byte offset of the magic; -1 when libblkid does not say
	Node   string `json:"node,omitempty"` // the partition it is on; "" for the disk itself
	By     string `json:"by,omitempty"`   // "libblkid", or "" for the built-in magic scan
}

func (s Signature) String() string {
	var b strings.Builder
	if s.Node != "" {
		b.WriteString(s.Node + ":")
	}
	b.WriteString(s.Type)
	if s.Offset >= 0 {
		fmt.Fprintf(&b, "@%d", s.Offset)
	}
	if s.By != "" {
		b.WriteString(" (" + s.By + ")")
	}
	return b.String()
}

// probe is one magic at one place. at returns the offsets to look at for a
// device of size bytes; match looks at the window read there.
type probe struct {
	typ   string
	at    func(size int64) []int64
	n     int // bytes to read at each offset
	match func(b []byte) bool
}

func fixed(offs ...int64) func(int64) []int64 { return func(int64) []int64 { return offs } }

func magic(m string) func([]byte) bool {
	return func(b []byte) bool { return bytes.Equal(b[:len(m)], []byte(m)) }
}

var mdMagic = string([]byte{0xfc, 0x4e, 0x2b, 0xa9}) // 0xa92b4efc little-endian

// probes lists the magics the built-in scan looks for. Offsets follow the
// on-disk formats (and util-linux libblkid's probers). It is not the list
// of what CheckSafe refuses: that is everything libblkid knows (see
// probeLibblkid). The scan adds bare magics libblkid ignores for want of a
// valid superblock (a lone MD magic, a backup GPT header), runs on images
// and readers that are not block devices, and names what Verify finds.
var probes = []probe{
	// GPT header at LBA 1 (512- or 4096-byte sectors) and the backup header
	// at the last LBA.
	{"gpt", fixed(512, 4096), 8, magic("EFI PART")},
	{"gpt_backup", func(size int64) []int64 { return []int64{size - 512, size - 4096} }, 8, magic("EFI PART")},
	// MBR partition table: boot signature plus at least one used entry,
	// and not a FAT/NTFS boot sector (reported on their own).
	{"dos", fixed(0), 512, isDOS},
	{"vfat", fixed(0), 512, func(b []byte) bool {
		return b[510] == 0x55 && b[511] == 0xaa && (bytes.HasPrefix(b[82:], []byte("FAT32   ")) ||
			bytes.HasPrefix(b[54:], []byte("FAT16   ")) || bytes.HasPrefix(b[54:], []byte("FAT12   ")))
	}},
	{"ntfs", fixed(3), 8, magic("NTFS    ")},
	{"ext4", fixed(1024 + 0x38), 2, magic("\x53\xef")}, // ext2/3/4 s_magic
	{"xfs", fixed(0), 4, magic("XFSB")},
	{"btrfs", func(size int64) []int64 { return []int64{64<<10 + 64, 64<<20 + 64, 256<<30 + 64} }, 8, magic("_BHRfS_M")},
	{"swap", fixed(4096-10, 8192-10, 16384-10, 65536-10), 10, func(b []byte) bool {
		return bytes.Equal(b, []byte("SWAPSPACE2")) || bytes.Equal(b, []byte("SWAP-SPACE"))
	}},
	// LVM2 physical volume label: "LABELONE" in one of the first four
	// sectors, type "LVM2 001" at +24.
	{"LVM2_member", fixed(0, 512, 1024, 1536), 32, func(b []byte) bool {
		return bytes.HasPrefix(b, []byte("LABELONE")) && bytes.Equal(b[24:32], []byte("LVM2 001"))
	}},
	// MD superblocks: v1.1 at 0, v1.2 at 4 KiB, v1.0 8 KiB before the end
	// (4 KiB aligned), v0.90 in the last 64 KiB-aligned 64 KiB block.
	{"linux_raid_member", func(size int64) []int64 {
		return []int64{0, 4096, ((size >> 9) - 16) &^ 7 << 9, (size &^ (64<<10 - 1)) - 64<<10}
	}, 4, magic(mdMagic)},
	{"crypto_LUKS", fixed(0), 6, magic("LUKS\xba\xbe")},
	{"iso9660", fixed(32769), 5, magic("CD001")},
}

func isDOS(b []byte) bool {
	if b[510] != 0x55 || b[511] != 0xaa {
		return false
	}
	if bytes.HasPrefix(b[82:], []byte("FAT32   ")) || bytes.HasPrefix(b[54:], []byte("FAT1")) || bytes.HasPrefix(b[3:], []byte("NTFS")) {
		return false
	}
	for i := 0; i < 4; i++ {
		e := b[446+16*i : 446+16*(i+1)]
		if e[4] != 0 { // partition type
			return true
		}
	}
	return false
}

// scanSignatures looks for every known signature on a device of size bytes
// read through r. It reads only small windows at the probe offsets.
func scanSignatures(r io.ReaderAt, size int64) ([]Signature, error) {
	var found []Signature
	seen := map[Signature]bool{}
	for _, p := range probes {
		for _, off := range p.at(size) {
			if off < 0 || off+int64(p.n) > size {
				continue
			}
			b := make([]byte, p.n)
			if _, err := r.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("read signature window %s at %d: %w", p.typ, off, err)
			}
			if p.match(b) {
				s := Signature{Type: p.typ, Offset: off}
				if !seen[s] {
					seen[s] = true
					found = append(found, s)
				}
			}
		}
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].Offset != found[j].Offset {
			return found[i].Offset < found[j].Offset
		}
		return found[i].Type < found[j].Type
	})
	return found, nil
}

// signatureIn names a known signature whose magic lies inside buf, which
// was read at offset off of a device of size bytes ("" if none).
func signatureIn(buf []byte, off, size int64) string {
	for _, p := range probes {
		for _, at := range p.at(size) {
			if at >= off && at+int64(p.n) <= off+int64(len(buf)) && p.match(buf[at-off:at-off+int64(p.n)]) {
				return p.typ
			}
		}
	}
	return ""
}
