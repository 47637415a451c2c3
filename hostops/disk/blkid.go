package disk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// probeTimeout bounds one blkid or wipefs run on a device.
const probeTimeout = 30 * time.Second

// probeLibblkid asks libblkid, through `blkid -p -o export` (util-linux),
// for every signature it knows on the open device f: filesystems, volume
// managers and caches (ZFS, bcache, LUKS, btrfs, Ceph BlueStore, LVM, MD,
// ...) as TYPE, partition tables as PTTYPE. The device is handed to blkid
// as its file descriptor 3, so it probes exactly the device that was
// opened and checked, not whatever the node names by then. node names the
// device in the signatures ("" for the disk itself).
//
// libblkid reports one filesystem; when several are present it answers
// "ambivalent" (exit 8), and wipefs (same library, every signature with
// its offset) names them.
func probeLibblkid(f *os.File, node string) ([]Signature, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	out, code, stderr, err := runOnFD(ctx, f, "blkid", "-p", "-o", "export", "/dev/fd/3")
	if err != nil {
		return nil, err
	}
	switch code {
	case 0:
		return parseBlkidExport(out, node), nil
	case 2: // nothing found
		return nil, nil
	case 8: // ambivalent: more than one signature
		out, code, _, err := runOnFD(ctx, f, "wipefs", "--no-act", "--json", "/dev/fd/3")
		if err != nil || code != 0 {
			return []Signature{{Type: "ambivalent", Offset: -1, Node: node, By: "libblkid"}}, nil
		}
		sigs, perr := parseWipefsJSON(out, node)
		if perr != nil || len(sigs) == 0 {
			return []Signature{{Type: "ambivalent", Offset: -1, Node: node, By: "libblkid"}}, nil
		}
		return sigs, nil
	default:
		return nil, fmt.Errorf("blkid -p %s: exit status %d: %s", f.Name(), code, strings.TrimSpace(stderr))
	}
}

// runOnFD runs name with f as its descriptor 3 and returns its standard
// output, exit code and standard error. err is set only when the program
// could not run at all (missing, killed, timed out).
func runOnFD(ctx context.Context, f *os.File, name string, args ...string) ([]byte, int, string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.ExtraFiles = []*os.File{f}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.Bytes(), 0, stderr.String(), nil
	case ctx.Err() != nil:
		return nil, 0, "", fmt.Errorf("%s %s: %w", name, f.Name(), ctx.Err())
	case errors.As(err, &ee) && ee.Exited():
		return stdout.Bytes(), ee.ExitCode(), stderr.String(), nil
	case errors.Is(err, exec.ErrNotFound):
		return nil, 0, "", fmt.Errorf("probe signatures of %s: %s (util-linux) is required: %w", f.Name(), name, err)
	default:
		return nil, 0, "", fmt.Errorf("%s %s: %w: %s", name, f.Name(), err, strings.TrimSpace(stderr.String()))
	}
}

// parseBlkidExport maps `blkid -p -o export` output to signatures: TYPE
// (a filesystem, volume-manager member, cache or crypto header) and
// PTTYPE (a partition table, also one nested in a partition). The
// PART_ENTRY_* keys describe the partition's entry in its parent's table,
// not its content, and are ignored.
func parseBlkidExport(out []byte, node string) []Signature {
	var sigs []Signature
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || v == "" {
			continue
		}
		if k == "TYPE" || k == "PTTYPE" {
			sigs = append(sigs, Signature{Type: v, Offset: -1, Node: node, By: "libblkid"})
		}
	}
	return sigs
}

// parseWipefsJSON maps `wipefs --no-act --json` output to signatures.
func parseWipefsJSON(out []byte, node string) ([]Signature, error) {
	var doc struct {
		Signatures []struct {
			Offset string `json:"offset"`
			Type   string `json:"type"`
		} `json:"signatures"`
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("wipefs output: %w", err)
	}
	var sigs []Signature
	for _, s := range doc.Signatures {
		off, err := strconv.ParseInt(s.Offset, 0, 64)
		if err != nil {
			return nil, fmt.Errorf("wipefs output: offset %q: %w", s.Offset, err)
		}
		sigs = append(sigs, Signature{Type: s.Type, Offset: off, Node: node, By: "libblkid"})
	}
	return sigs, nil
}
