package launch

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/ingress"
)

// Public ingress of the lab's real slice host. Its guests sit on a bridge
// in this machine's network namespace, so the DNAT to them is programmed
// here too: the agent gets this machine's namespace under a name of its
// own (a bind mount, `ip netns attach`; PID 1's may be out of reach in a
// container), as -ingress-netns, and owns the table in it. The "public"
// side is another namespace joined to this machine by a veth pair and
// routed to the ingress pool's addresses through it, so a client there
// reaches a slice through its public endpoint as one on the Internet
// would (a connection from this machine's own namespace would not pass
// the nat prerouting hook).

// IngressOptions names the lab ingress's kernel objects and addresses.
type IngressOptions struct {
	// Name is the name the agent's namespace (this machine's) gets under
	// /run/netns; the public side is Name+"-pub", the host end of the
	// veth pair derived from it. At most 11 characters of [a-z0-9-].
	Name string
	// Link is the /30 of the veth pair: its first address on this
	// machine's end, its second on the public side's (default
	// 172.31.253.0/30).
	Link netip.Prefix
	// Public is the prefix of the public addresses, routed from the
	// public side to this machine (default 203.0.113.0/24, TEST-NET-3).
	Public netip.Prefix
	// Table is the agent's ingress table (default gpuaas_ingress), deleted
	// by Close.
	Table string
	// Runner runs ip, nft (default command.Exec).
	Runner command.Runner
}

// LabIngress is the set-up public ingress, undone by Close.
type LabIngress struct {
	o IngressOptions
	// Netns is the path the agent is given as -ingress-netns.
	Netns string
	// PublicNetns is the name of the public side's namespace
	// (`ip netns exec PublicNetns curl ...`).
	PublicNetns string
	// HostLink is this machine's end of the veth pair.
	HostLink   string
	forwardWas []byte // net.ipv4.ip_forward before (nil: left alone)
}

var ingressNameRe = regexp.MustCompile(`^[a-z][a-z0-9-]{0,10}$`)

// forwardFile is where IPv4 forwarding is switched.
var forwardFile = "/proc/sys/net/ipv4/ip_forward"

// SetupIngress creates the lab's public ingress: this machine's namespace
// named o.Name, the public side o.Name-pub with its veth pair and route to
// the public addresses, and IPv4 forwarding on (restored by Close; the
// guests' replies are routed by this machine). Objects of the same names
// left by a run killed before its clean-up are removed first; a failed
// set-up undoes what it did.
func SetupIngress(ctx context.Context, o IngressOptions) (_ *LabIngress, err error) {
	if !ingressNameRe.MatchString(o.Name) {
		return nil, fmt.Errorf("lab ingress: name %q: want 1-11 characters of [a-z0-9-], starting with a letter", o.Name)
	}
	if !o.Link.IsValid() {
		o.Link = netip.MustParsePrefix("172.31.253.0/30")
	}
	if !o.Public.IsValid() {
		o.Public = netip.MustParsePrefix("203.0.113.0/24")
	}
	if o.Link.Bits() != 30 || !o.Link.Addr().Is4() || o.Link.Masked() != o.Link {
		return nil, fmt.Errorf("lab ingress: link %s: want an IPv4 /30", o.Link)
	}
	if !o.Public.Addr().Is4() || o.Public.Masked() != o.Public {
		return nil, fmt.Errorf("lab ingress: public prefix %s: want an IPv4 network", o.Public)
	}
	if o.Table == "" {
		o.Table = ingress.DefaultTable
	}
	if o.Runner == nil {
		o.Runner = command.Exec{}
	}
	li := &LabIngress{o: o, Netns: filepath.Join("/run/netns", o.Name), PublicNetns: o.Name + "-pub", HostLink: "vp-" + o.Name}
	defer func() {
		if err != nil {
			err = errors.Join(err, li.Close(context.WithoutCancel(ctx)))
		}
	}()
	// What a lab killed before its clean-up left under these names.
	if err := li.Close(ctx); err != nil {
		return nil, err
	}
	was, err := os.ReadFile(forwardFile)
	if err != nil {
		return nil, fmt.Errorf("lab ingress: %w", err)
	}
	if strings.TrimSpace(string(was)) != "1" {
		if err := os.WriteFile(forwardFile, []byte("1\n"), 0o644); err != nil {
			return nil, fmt.Errorf("lab ingress: turn IPv4 forwarding on: %w", err)
		}
		li.forwardWas = was
	}
	hostAddr := o.Link.Addr().Next()
	pubAddr := hostAddr.Next()
	steps := [][]string{
		{"netns", "attach", o.Name, strconv.Itoa(os.Getpid())},
		{"netns", "add", li.PublicNetns},
		{"link", "add", li.HostLink, "type", "veth", "peer", "name", "eth0", "netns", li.PublicNetns},
		{"addr", "add", fmt.Sprintf("%s/30", hostAddr), "dev", li.HostLink},
		{"link", "set", li.HostLink, "up"},
		{"-n", li.PublicNetns, "link", "set", "lo", "up"},
		{"-n", li.PublicNetns, "link", "set", "eth0", "up"},
		{"-n", li.PublicNetns, "addr", "add", fmt.Sprintf("%s/30", pubAddr), "dev", "eth0"},
		{"-n", li.PublicNetns, "route", "add", o.Public.String(), "via", hostAddr.String()},
	}
	for _, args := range steps {
		if _, err := o.Runner.Run(ctx, command.Cmd{Name: "ip", Args: args}); err != nil {
			return nil, fmt.Errorf("lab ingress: ip %s: %w", strings.Join(args, " "), err)
		}
	}
	return li, nil
}

// Close removes the agent's ingress table, the veth pair, both namespace
// names (this machine's namespace itself stays, only its name goes) and
// restores IPv4 forwarding. Objects already gone are not an error.
func (li *LabIngress) Close(ctx context.Context) error {
	var errs []error
	run := func(name string, args ...string) error {
		_, err := li.o.Runner.Run(ctx, command.Cmd{Name: name, Args: args})
		return err
	}
	t := "inet " + li.o.Table
	if _, err := li.o.Runner.Run(ctx, command.Cmd{Name: "nft", Args: []string{"-f", "-"}, Stdin: "add table " + t + "\ndelete table " + t + "\n"}); err != nil {
		errs = append(errs, fmt.Errorf("delete the ingress table %s: %w", t, err))
	}
	if err := run("ip", "link", "del", li.HostLink); err != nil && linkExists(li.HostLink) {
		errs = append(errs, fmt.Errorf("delete veth %s: %w", li.HostLink, err))
	}
	for _, ns := range []string{li.PublicNetns, li.o.Name} {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err != nil {
			continue
		}
		if err := run("ip", "netns", "delete", ns); err != nil {
			errs = append(errs, fmt.Errorf("delete netns %s: %w", ns, err))
		}
	}
	if li.forwardWas != nil {
		if err := os.WriteFile(forwardFile, li.forwardWas, 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore IPv4 forwarding: %w", err))
		}
		li.forwardWas = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab ingress clean-up: %w", err)
	}
	return nil
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}
