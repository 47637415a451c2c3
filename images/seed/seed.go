// Package seed makes the per-allocation cloud-init NoCloud seed: an ISO 9660
// image labelled "cidata" holding user-data (#cloud-config: hostname and the
// allocation's SSH keys), meta-data (a fresh instance-id and the local
// hostname) and network-config (version 2: DHCPv4 on the NIC with the
// reserved MAC). It is attached to the slice VM as a CD-ROM.
//
// The image is plain ISO 9660 (github.com/kdomanski/iso9660 writes no Rock
// Ridge or Joliet names), so a guest without those extensions sees the
// level-1 names user_data, meta_data and network_config; the lab guest
// reads either spelling.
package seed

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"

	"github.com/kdomanski/iso9660"
	"golang.org/x/crypto/ssh"
)

// VolumeLabel is the label NoCloud looks for.
const VolumeLabel = "cidata"

// File names on the seed.
const (
	UserData      = "user-data"
	MetaData      = "meta-data"
	NetworkConfig = "network-config"
)

// Config is what one allocation's seed says.
type Config struct {
	InstanceID        string   // fresh per allocation (NewInstanceID)
	Hostname          string   // RFC 1123 host name, lower case
	SSHAuthorizedKeys []string // authorized_keys lines
	MAC               string   // the reserved management MAC
	// Address is the reserved address with the guest subnet's prefix
	// (optional). DHCP hands out the same address (the reservation is
	// the readiness gate's evidence); network-config records it too.
	Address netip.Prefix
}

var (
	labelRE      = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	instanceIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// NewInstanceID returns a fresh instance-id ("i-" and 16 random hex
// digits). A new one per allocation makes cloud-init treat every
// allocation of a reused disk as a first boot.
func NewInstanceID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("instance-id: %w", err)
	}
	return "i-" + hex.EncodeToString(b[:]), nil
}

// Validate checks every field; the error names the first bad one.
func (c Config) Validate() error {
	if !instanceIDRE.MatchString(c.InstanceID) {
		return fmt.Errorf("seed: instance-id %q: want 1-128 of [A-Za-z0-9._-], not starting with a punctuation", c.InstanceID)
	}
	if err := validHostname(c.Hostname); err != nil {
		return err
	}
	if len(c.SSHAuthorizedKeys) == 0 {
		return errors.New("seed: no SSH authorized key")
	}
	for i, k := range c.SSHAuthorizedKeys {
		if strings.ContainsAny(k, "\r\n") {
			return fmt.Errorf("seed: SSH key %d: contains a line break", i)
		}
		if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return fmt.Errorf("seed: SSH key %d: %w", i, err)
		} else if len(rest) != 0 {
			return fmt.Errorf("seed: SSH key %d: trailing data", i)
		}
	}
	mac, err := net.ParseMAC(c.MAC)
	if err != nil {
		return fmt.Errorf("seed: MAC %q: %w", c.MAC, err)
	}
	if len(mac) != 6 || mac[0]&1 != 0 || c.MAC != mac.String() {
		return fmt.Errorf("seed: MAC %q: want a unicast EUI-48 in lower-case colon form (e.g. 52:54:00:12:34:56)", c.MAC)
	}
	if c.Address.IsValid() && (!c.Address.Addr().Is4() || c.Address.Bits() < 8 || c.Address.Bits() > 30) {
		return fmt.Errorf("seed: address %s: want an IPv4 address with a prefix between /8 and /30", c.Address)
	}
	return nil
}

func validHostname(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("seed: hostname %q: want 1-253 characters", h)
	}
	for _, l := range strings.Split(h, ".") {
		if !labelRE.MatchString(l) {
			return fmt.Errorf("seed: hostname %q: label %q is not [a-z0-9-] (1-63, no leading or trailing dash)", h, l)
		}
	}
	return nil
}

// Files returns the seed's files, name -> content. The YAML is generated
// from validated fields only (no user text needs quoting: keys are parsed
// and re-marshalled, hostnames and ids are restricted alphabets).
func (c Config) Files() (map[string][]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var ud strings.Builder
	ud.WriteString("#cloud-config\n")
	fmt.Fprintf(&ud, "hostname: %s\n", c.Hostname)
	fmt.Fprintf(&ud, "preserve_hostname: false\n")
	ud.WriteString("ssh_authorized_keys:\n")
	for _, k := range c.SSHAuthorizedKeys {
		pk, comment, _, _, _ := ssh.ParseAuthorizedKey([]byte(k)) // validated above
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk)))
		if comment != "" {
			line += " " + comment
		}
		fmt.Fprintf(&ud, "  - %q\n", line)
	}
	md := fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", c.InstanceID, c.Hostname)
	nc := fmt.Sprintf("version: 2\nethernets:\n  mgmt0:\n    match:\n      macaddress: %q\n    set-name: mgmt0\n    dhcp4: true\n", c.MAC)
	if c.Address.IsValid() {
		nc += fmt.Sprintf("    addresses:\n      - %q\n", c.Address.String())
	}
	return map[string][]byte{UserData: []byte(ud.String()), MetaData: []byte(md), NetworkConfig: []byte(nc)}, nil
}

// Write writes the seed ISO for c to w.
func Write(w io.Writer, c Config) error {
	files, err := c.Files()
	if err != nil {
		return err
	}
	iw, err := iso9660.NewWriter()
	if err != nil {
		return fmt.Errorf("seed %s: %w", c.InstanceID, err)
	}
	defer iw.Cleanup()
	for _, name := range []string{UserData, MetaData, NetworkConfig} {
		if err := iw.AddFile(bytes.NewReader(files[name]), name); err != nil {
			return fmt.Errorf("seed %s: add %s: %w", c.InstanceID, name, err)
		}
	}
	if err := iw.WriteTo(w, VolumeLabel); err != nil {
		return fmt.Errorf("seed %s: write ISO: %w", c.InstanceID, err)
	}
	return nil
}

// WriteFile writes the seed ISO for c to path (created, mode 0644; the
// hypervisor must read it). An existing file is not overwritten.
func WriteFile(path string, c Config) (err error) {
	if err := c.Validate(); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("seed %s: %w", c.InstanceID, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("seed %s: close %s: %w", c.InstanceID, path, cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	return Write(f, c)
}

// Read parses a seed ISO back: its volume label and files, by their
// NoCloud names (level-1 names are mapped back).
func Read(r io.ReaderAt) (label string, files map[string][]byte, err error) {
	img, err := iso9660.OpenImage(r)
	if err != nil {
		return "", nil, fmt.Errorf("read seed: %w", err)
	}
	if label, err = img.Label(); err != nil {
		return "", nil, fmt.Errorf("read seed label: %w", err)
	}
	root, err := img.RootDir()
	if err != nil {
		return "", nil, fmt.Errorf("read seed root: %w", err)
	}
	children, err := root.GetChildren()
	if err != nil {
		return "", nil, fmt.Errorf("read seed root: %w", err)
	}
	files = map[string][]byte{}
	for _, ch := range children {
		if ch.IsDir() {
			continue
		}
		b, err := io.ReadAll(ch.Reader())
		if err != nil {
			return "", nil, fmt.Errorf("read seed file %s: %w", ch.Name(), err)
		}
		files[strings.ReplaceAll(ch.Name(), "_", "-")] = b
	}
	return label, files, nil
}
