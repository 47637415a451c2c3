package seed

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

func testKey(t testing.TB) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sp, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " operator@example"
}

func validConfig(t testing.TB) Config {
	id, err := NewInstanceID()
	require.NoError(t, err)
	return Config{InstanceID: id, Hostname: "slice-j22u15-g0", SSHAuthorizedKeys: []string{testKey(t)}, MAC: "52:54:00:12:34:56"}
}

func TestWriteReadBack(t *testing.T) {
	t.Parallel()
	c := validConfig(t)
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, c))
	label, files, err := Read(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.Equal(t, VolumeLabel, label)

	want := map[string][]byte{
		UserData: []byte("#cloud-config\nhostname: slice-j22u15-g0\npreserve_hostname: false\nssh_authorized_keys:\n  - \"" +
			c.SSHAuthorizedKeys[0] + "\"\n"),
		MetaData:      []byte("instance-id: " + c.InstanceID + "\nlocal-hostname: slice-j22u15-g0\n"),
		NetworkConfig: []byte("version: 2\nethernets:\n  mgmt0:\n    match:\n      macaddress: \"52:54:00:12:34:56\"\n    set-name: mgmt0\n    dhcp4: true\n"),
	}
	if d := cmp.Diff(want, files); d != "" {
		t.Fatalf("seed files (-want +got):\n%s", d)
	}
}

func TestWriteFileRefusesExistingAndBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "seed.iso")
	c := validConfig(t)
	require.NoError(t, WriteFile(p, c))
	before, err := os.ReadFile(p)
	require.NoError(t, err)
	require.ErrorIs(t, WriteFile(p, c), os.ErrExist)
	after, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, before, after)

	bad := c
	bad.Hostname = "Bad_Host"
	q := filepath.Join(dir, "bad.iso")
	require.ErrorContains(t, WriteFile(q, bad), "hostname")
	_, err = os.Stat(q)
	require.ErrorIs(t, err, os.ErrNotExist, "bad input must write nothing")
}

func TestNewInstanceIDFresh(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		id, err := NewInstanceID()
		require.NoError(t, err)
		require.Regexp(t, `^i-[0-9a-f]{16}$`, id)
		require.False(t, seen[id], "duplicate instance-id %s", id)
		seen[id] = true
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	ok := Config{InstanceID: "i-0123", Hostname: "slice-a.lab", SSHAuthorizedKeys: []string{key}, MAC: "52:54:00:aa:bb:cc"}
	require.NoError(t, ok.Validate())
	for name, tc := range map[string]struct {
		mut  func(*Config)
		want string
	}{
		"empty instance-id":      {func(c *Config) { c.InstanceID = "" }, "instance-id"},
		"instance-id with slash": {func(c *Config) { c.InstanceID = "i-1/../x" }, "instance-id"},
		"instance-id yaml":       {func(c *Config) { c.InstanceID = "i-1\nhostname: x" }, "instance-id"},
		"empty hostname":         {func(c *Config) { c.Hostname = "" }, "hostname"},
		"upper-case hostname":    {func(c *Config) { c.Hostname = "Slice" }, "hostname"},
		"leading dash":           {func(c *Config) { c.Hostname = "-slice" }, "hostname"},
		"trailing dash":          {func(c *Config) { c.Hostname = "slice-" }, "hostname"},
		"empty label":            {func(c *Config) { c.Hostname = "a..b" }, "hostname"},
		"label too long":         {func(c *Config) { c.Hostname = strings.Repeat("a", 64) }, "hostname"},
		"underscore":             {func(c *Config) { c.Hostname = "a_b" }, "hostname"},
		"no keys":                {func(c *Config) { c.SSHAuthorizedKeys = nil }, "no SSH authorized key"},
		"garbage key":            {func(c *Config) { c.SSHAuthorizedKeys = []string{"ssh-ed25519 notbase64"} }, "SSH key 0"},
		"two keys in one":        {func(c *Config) { c.SSHAuthorizedKeys = []string{key + "\n" + key} }, "line break"},
		"bad MAC":                {func(c *Config) { c.MAC = "52:54:00:zz:bb:cc" }, "MAC"},
		"multicast MAC":          {func(c *Config) { c.MAC = "01:00:5e:00:00:01" }, "unicast"},
		"upper-case MAC":         {func(c *Config) { c.MAC = "52:54:00:AA:BB:CC" }, "lower-case"},
		"EUI-64":                 {func(c *Config) { c.MAC = "02:00:5e:10:00:00:00:01" }, "EUI-48"},
	} {
		t.Run(name, func(t *testing.T) {
			c := ok
			tc.mut(&c)
			err := c.Validate()
			require.ErrorContains(t, err, tc.want)
			_, ferr := c.Files()
			require.Error(t, ferr)
		})
	}
}

func TestReservedAddressInNetworkConfig(t *testing.T) {
	t.Parallel()
	c := Config{InstanceID: "i-1", Hostname: "h", SSHAuthorizedKeys: []string{testKey(t)}, MAC: "52:54:00:12:34:56",
		Address: netip.MustParsePrefix("10.200.0.10/24")}
	files, err := c.Files()
	require.NoError(t, err)
	assert.Equal(t, "version: 2\nethernets:\n  mgmt0:\n    match:\n      macaddress: \"52:54:00:12:34:56\"\n    set-name: mgmt0\n    dhcp4: true\n    addresses:\n      - \"10.200.0.10/24\"\n",
		string(files[NetworkConfig]))
	c.Address = netip.MustParsePrefix("fd00::1/64")
	assert.ErrorContains(t, c.Validate(), "address")
}
