package netnstest

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const udhcpcScript = `#!/bin/sh
case "$1" in
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/$mask" dev "$interface"
	[ -n "$router" ] && ip route replace default via "$router"
	echo "$ip/$mask $router" > "$GPUAAS_DHCP_OUT"
	;;
esac
exit 0
`

// DHCPLease runs a real DHCP client (busybox udhcpc) on iface inside ns.
// It returns the leased address with its prefix (applied to iface, with
// the default route through the offered router) and ok=true, or ok=false
// when no server answered within about three seconds.
func (ns *NS) DHCPLease(t testing.TB, iface string) (netip.Prefix, bool) {
	t.Helper()
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Fatalf("DHCP client needs busybox (package busybox): %v", err)
	}
	dir := t.TempDir()
	script, out := filepath.Join(dir, "udhcpc.sh"), filepath.Join(dir, "lease")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := ns.Exec("GPUAAS_DHCP_OUT="+out).Run(context.Background(), cmd("busybox", "udhcpc", "-i", iface, "-f", "-q", "-n", "-t", "3", "-T", "1", "-A", "1", "-s", script))
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return netip.Prefix{}, false
	}
	if err != nil {
		t.Fatalf("udhcpc in %s: %v", ns.Name, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("udhcpc in %s exited 0 but its script recorded no lease: %v", ns.Name, err)
	}
	p, err := netip.ParsePrefix(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatalf("udhcpc lease %q: %v", b, err)
	}
	return p, true
}
