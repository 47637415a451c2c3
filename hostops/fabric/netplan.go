package fabric

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
)

// NetplanFile is the file name of the IPoIB netplan file under
// /etc/netplan. The 60- prefix orders it after the MAAS-written 50-cloud-init.
const NetplanFile = "60-gpuaas-ipoib.yaml"

// NetplanPath returns where the IPoIB netplan file lives under root.
func NetplanPath(root hostops.Root) string { return root.EtcPath("netplan", NetplanFile) }

// netplanMode is the file mode netplan requires (it warns about, and newer
// versions refuse, world-readable configuration).
const netplanMode = 0o600

const netplanHeader = "# Written by gpuaas (hostops/fabric): the site fabric address and route\n" +
	"# of the IPoIB interface. The node agent rewrites this file; do not edit.\n"

type netplanDoc struct {
	Network netplanNetwork `yaml:"network"`
}

type netplanNetwork struct {
	Version   int                   `yaml:"version"`
	Renderer  string                `yaml:"renderer"`
	Ethernets map[string]netplanEth `yaml:"ethernets"`
}

type netplanEth struct {
	DHCP4          bool           `yaml:"dhcp4"`
	DHCP6          bool           `yaml:"dhcp6"`
	Optional       bool           `yaml:"optional"`
	InfinibandMode string         `yaml:"infiniband-mode,omitempty"`
	MTU            int            `yaml:"mtu,omitempty"`
	Addresses      []string       `yaml:"addresses"`
	Routes         []netplanRoute `yaml:"routes"`
}

type netplanRoute struct {
	To     string `yaml:"to"`
	Via    string `yaml:"via"`
	Metric int    `yaml:"metric,omitempty"`
}

func netplanFor(s Spec) netplanDoc {
	return netplanDoc{Network: netplanNetwork{
		Version:  2,
		Renderer: "networkd",
		Ethernets: map[string]netplanEth{s.Interface: {
			// optional: boot does not wait for the fabric
			// (systemd-networkd-wait-online stays bounded, seed 002).
			Optional:       true,
			InfinibandMode: s.Mode,
			MTU:            s.MTU,
			Addresses:      []string{s.Address.String()},
			Routes:         []netplanRoute{{To: s.Route.To.String(), Via: s.Route.Via.String(), Metric: s.Route.Metric}},
		}},
	}}
}

// RenderNetplan renders the IPoIB netplan file for s.
func RenderNetplan(s Spec) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("render netplan: %w", err)
	}
	var buf bytes.Buffer
	buf.WriteString(netplanHeader)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(netplanFor(s)); err != nil {
		return nil, fmt.Errorf("render netplan for %s: %w", s.Interface, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("render netplan for %s: %w", s.Interface, err)
	}
	return buf.Bytes(), nil
}

// WriteNetplan writes the IPoIB netplan file under root (mode 0600,
// atomically: temp file + rename). It reports whether it changed anything;
// a file already holding the rendered content with the right mode is left
// alone. It does not run `netplan apply`: Apply sets the live state, the
// file keeps it across reboots.
func WriteNetplan(root hostops.Root, s Spec) (bool, error) {
	want, err := RenderNetplan(s)
	if err != nil {
		return false, err
	}
	path := NetplanPath(root)
	if got, err := os.ReadFile(path); err == nil && bytes.Equal(got, want) {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() == netplanMode {
			return false, nil
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("write netplan %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, want, netplanMode); err != nil {
		return false, fmt.Errorf("write netplan: %w", err)
	}
	return true, nil
}

// CheckNetplan reads the IPoIB netplan file under root and reports how it
// differs from s: absent, unreadable as netplan, wrong mode, or describing
// another configuration. Formatting and comments do not matter; content
// does.
func CheckNetplan(root hostops.Root, s Spec) (Drift, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("check netplan: %w", err)
	}
	path := NetplanPath(root)
	want := "file " + path + " describing " + s.Address.String() + " on " + s.Interface
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Drift{{What: "netplan", Want: want, Got: "absent"}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("check netplan %s: %w", path, err)
	}
	var d Drift
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("check netplan %s: %w", path, err)
	}
	if st.Mode().Perm() != netplanMode {
		d = append(d, Item{What: "netplan", Want: "mode 0600", Got: "mode " + strconv.FormatUint(uint64(st.Mode().Perm()), 8)})
	}
	var got netplanDoc
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&got); err != nil {
		return append(d, Item{What: "netplan", Want: want, Got: "not the gpuaas IPoIB netplan: " + err.Error()}), nil
	}
	if !reflect.DeepEqual(netplanFor(s), got) {
		d = append(d, Item{What: "netplan", Want: want, Got: "different content: " + summarize(got)})
	}
	return d, nil
}

// summarize describes a parsed netplan document in one line, for drift
// reports: "ibp24s0: addresses [10.224.3.16/16], routes [10.224.0.0/12 via
// 10.224.0.1 metric 0], mtu 2044, mode datagram, dhcp4 false".
func summarize(doc netplanDoc) string {
	n := doc.Network
	names := make([]string, 0, len(n.Ethernets))
	for name := range n.Ethernets {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := []string{fmt.Sprintf("version %d, renderer %q", n.Version, n.Renderer)}
	for _, name := range names {
		e := n.Ethernets[name]
		routes := make([]string, len(e.Routes))
		for i, r := range e.Routes {
			routes[i] = fmt.Sprintf("%s via %s metric %d", r.To, r.Via, r.Metric)
		}
		parts = append(parts, fmt.Sprintf("%s: addresses [%s], routes [%s], mtu %d, mode %q, dhcp4 %t, dhcp6 %t, optional %t",
			name, strings.Join(e.Addresses, " "), strings.Join(routes, ", "), e.MTU, e.InfinibandMode, e.DHCP4, e.DHCP6, e.Optional))
	}
	return strings.Join(parts, "; ")
}
