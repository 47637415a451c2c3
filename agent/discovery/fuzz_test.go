package discovery

import (
	"regexp"
	"strings"
	"testing"
)

// plainSignature is what a reported disk signature may look like: short
// printable ASCII (it goes into the candidate topology the coordinator
// stores and shows).
var plainSignature = regexp.MustCompile(`^[\x20-\x7e]{1,80}$`)

// FuzzParseUdevSignature parses a udev database record (/run/udev/data,
// written by udev from what is on the disk): never a panic; a record that
// names a filesystem or partition table always yields a signature (a
// disk holding data is never reported clean), and every signature is
// short printable text.
func FuzzParseUdevSignature(f *testing.F) {
	for _, s := range []string{
		"E:ID_FS_TYPE=ext4\nE:ID_PART_ENTRY_NUMBER=1\n",
		"E:ID_PART_TABLE_TYPE=gpt\n",
		"E:ID_SERIAL=x\n",
		"E:ID_FS_TYPE=\nE:ID_PART_TABLE_TYPE=dos\n",
		"E:ID_FS_TYPE=crypto_LUKS\r\n",
		"E:ID_FS_TYPE=\xff\xfe\x00" + strings.Repeat("A", 300) + "\n",
		"E:ID_FS_TYPE=ext4\nE:ID_FS_TYPE=\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rec string) {
		got := ParseUdevSignature(rec)
		named := false
		for line := range strings.SplitSeq(rec, "\n") {
			for _, k := range []string{"E:ID_FS_TYPE=", "E:ID_PART_TABLE_TYPE="} {
				if v, ok := strings.CutPrefix(line, k); ok && v != "" {
					named = true
				}
			}
		}
		if named && got == "" {
			t.Fatalf("record %q names a signature but none is reported", rec)
		}
		if got != "" && !plainSignature.MatchString(got) {
			t.Fatalf("signature %q (from %q) is not short printable text", got, rec)
		}
	})
}

// FuzzParseDiskIDs: NVMe serials and EUI-64/NGUIDs read from sysfs are
// either refused or normalised into the form the ledger keys disks by
// (parsing the result again gives the same value).
func FuzzParseDiskIDs(f *testing.F) {
	for _, s := range []string{"S7DKNE0XJ1100      ", "   ", "00 25 38 01 b5 31 a0 00", "0025-3801-b531-a000-0025-3801-b531-a000", "x\x00y", "eui.0025"} {
		f.Add(s)
	}
	hex := regexp.MustCompile(`^[0-9a-f]{16}([0-9a-f]{16})?$`)
	f.Fuzz(func(t *testing.T, s string) {
		if sn, err := ParseSerial(s); err == nil {
			if again, err := ParseSerial(sn); err != nil || again != sn || len(sn) > 20 || sn == "" {
				t.Fatalf("serial %q normalised to %q, which parses to %q (%v)", s, sn, again, err)
			}
		}
		if e, err := ParseEUI(s); err == nil {
			if !hex.MatchString(e) {
				t.Fatalf("EUI %q normalised to %q", s, e)
			}
			if again, err := ParseEUI(e); err != nil || again != e {
				t.Fatalf("EUI %q normalised to %q, which parses to %q (%v)", s, e, again, err)
			}
		}
		ok, why := IOMMUEnabled(s)
		if why == "" || ok && !strings.Contains(s, "intel_iommu=on") {
			t.Fatalf("command line %q: IOMMU %v (%q)", s, ok, why)
		}
	})
}
