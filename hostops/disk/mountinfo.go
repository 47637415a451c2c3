package disk

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// MountEntry is one line of /proc/self/mountinfo.
type MountEntry struct {
	Major, Minor uint32
	Root         string // path inside the filesystem
	MountPoint   string
	FSType       string
	Source       string // e.g. /dev/nvme0n1p1
}

// ReadMountinfo reads the mount table under root.
func ReadMountinfo(root hostops.Root) ([]MountEntry, error) {
	p := root.ProcPath("self", "mountinfo")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read mount table %s: %w", p, err)
	}
	ms, err := ParseMountinfo(string(b))
	if err != nil {
		return nil, fmt.Errorf("parse mount table %s: %w", p, err)
	}
	return ms, nil
}

// ParseMountinfo parses the content of /proc/self/mountinfo (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// Paths are unescaped (\040 is a space).
func ParseMountinfo(content string) ([]MountEntry, error) {
	var out []MountEntry
	for i, line := range strings.Split(content, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		sep := -1
		for j := 6; j < len(f); j++ {
			if f[j] == "-" {
				sep = j
				break
			}
		}
		if len(f) < 10 || sep < 0 || len(f) < sep+3 {
			return nil, fmt.Errorf("line %d: malformed mountinfo line %q", i+1, line)
		}
		maj, min, err := parseDevT(f[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		out = append(out, MountEntry{
			Major: maj, Minor: min,
			Root:       unescapeOctal(f[3]),
			MountPoint: unescapeOctal(f[4]),
			FSType:     f[sep+1],
			Source:     unescapeOctal(f[sep+2]),
		})
	}
	return out, nil
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline
// and backslash in mount paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readSwaps reads the active swap areas under root (/proc/swaps); a missing
// file means none.
func readSwaps(root hostops.Root) ([]string, error) {
	p := root.ProcPath("swaps")
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read swap table %s: %w", p, err)
	}
	return parseSwaps(string(b)), nil
}

// parseSwaps returns the device/file names of /proc/swaps.
func parseSwaps(content string) []string {
	var out []string
	for i, line := range strings.Split(content, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 {
			continue // header
		}
		out = append(out, unescapeOctal(f[0]))
	}
	return out
}
