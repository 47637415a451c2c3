// Package maaslab onboards the lab's hosts through MAAS the way real hosts
// are onboarded: a MAAS 2.0 simulator (lab/maassim) stands in for the
// region, the coordinators run the onboarding workflows against it
// (coordinator/maasflow), and when the simulator marks a machine Deployed
// the lab plays the host's first boot — cloud-init's write_files from the
// user-data MAAS received, then its runcmd: the real gpuaas-bootstrap,
// which fetches and runs the site bundle, installs the agent
// configuration and the single-use token, starts the real gpuaas-agent on
// the simulated host root and lets it enroll; the agent then runs the
// post-deploy validation bundle as its node.validate task.
//
//	gpuaas-lab -maas ─▶ site + profiles + bundles (API) ─▶ POST /v1/sites/lab/onboard ×3
//	maassim Deployed ─▶ OnDeployed(user-data) ─▶ write_files ─▶ gpuaas-bootstrap ─▶ gpuaas-agent ─▶ enroll
package maaslab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

// Names of the lab's MAAS site and profiles.
const (
	Site             = "lab"
	ProfileSlice     = "lab-slice"
	ProfileBaremetal = "lab-baremetal"
	Region           = "lab-east"
	Pool             = "lab-h200"
)

// PXEMAC is the PXE MAC a lab host boots from (hostsim gives every host
// of a model the same NIC MACs, which MAAS cannot hold twice).
func PXEMAC(host string) string {
	switch host {
	case "j22u15":
		return "52:54:00:22:15:01"
	case "j22u11":
		return "52:54:00:22:11:01"
	case "j27u15":
		return "52:54:00:27:15:01"
	}
	return ""
}

// SiteBundle is the lab's site bootstrap bundle: the site-specific first
// boot wiring (here: a marker the validation bundle checks).
const SiteBundle = `#!/bin/sh
set -eu
mkdir -p "$GPUAAS_HOST_ROOT/etc/gpuaas"
echo "site bootstrap of $GPUAAS_NODE_ID ($GPUAAS_WORKFLOW)" > "$GPUAAS_HOST_ROOT/etc/gpuaas/site-bootstrap.done"
echo "site wired for $GPUAAS_NODE_ID"
`

// ValidationBundle is the lab's post-deploy validation bundle.
const ValidationBundle = `#!/bin/sh
set -eu
test -s "$GPUAAS_HOST_ROOT/etc/gpuaas/site-bootstrap.done" || { echo "site bootstrap marker missing" >&2; exit 1; }
test -d "$GPUAAS_HOST_ROOT/sys/class/infiniband" || { echo "no HCA" >&2; exit 1; }
echo "validated $GPUAAS_NODE_ID ($GPUAAS_FABRIC_MODE)"
`

// TenantUserData is the lab baremetal profile's tenant_user_data: what
// the site adds to every tenant deploy (here: a login banner).
const TenantUserData = `#cloud-config
write_files:
  - path: /etc/motd
    permissions: '0644'
    content: |
      gpuaas lab: bare-metal H200 node deployed by MAAS for your allocation
`

// Config configures the MAAS part of the lab.
type Config struct {
	Hosts        []fleet.Host
	Agents       fleet.Agents // the agents' binary, coordinators, logs
	BootstrapBin string       // gpuaas-bootstrap
	// Start runs a host's gpuaas-bootstrap process (the lab's
	// supervisor: restarted if it exits, stopped with the lab).
	Start func(*launch.Proc) error
	// Speed is the simulator's clock factor (default 600: a 12-minute
	// deploy takes 1.2 s).
	Speed float64
	// BatchMaxParallel is the slice profile's batch_max_parallel.
	BatchMaxParallel int
	Logger           *slog.Logger
}

// Lab is a running simulated MAAS region and the hosts' first boots.
type Lab struct {
	cfg    Config
	Sim    *maassim.Server
	URL    string // MAAS base URL (…/MAAS)
	APIKey string
	srv    *http.Server
	log    *slog.Logger

	mu      sync.Mutex
	boots   map[string]*launch.Proc // by host
	errs    map[string]error
	tenants map[string]maassim.Deployed // the last tenant deploy, by host
}

// Start starts the simulator on a loopback port with each host's
// hardware (what commissioning discovers, from its hostsim profile).
func Start(cfg Config) (*Lab, error) {
	if cfg.Speed <= 0 {
		cfg.Speed = 600
	}
	if cfg.BatchMaxParallel <= 0 {
		cfg.BatchMaxParallel = len(cfg.Hosts)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key, err := apiKey()
	if err != nil {
		return nil, err
	}
	l := &Lab{cfg: cfg, APIKey: key, log: log.With("component", "maaslab"), boots: map[string]*launch.Proc{}, errs: map[string]error{},
		tenants: map[string]maassim.Deployed{}}
	l.Sim = maassim.New(maassim.Options{Clock: maassim.NewScaledClock(time.Now().UTC(), cfg.Speed), APIKeys: []string{key},
		Subnets:    []maassim.Subnet{{ID: 1, Name: "pxe", CIDR: "10.10.0.0/24", GatewayIP: "10.10.0.1"}},
		OnDeployed: func(d maassim.Deployed) { go l.firstBoot(d) }, Logger: log})
	for _, h := range cfg.Hosts {
		hw, err := maassim.HardwareFromHostsim(h.Name)
		if err != nil {
			return nil, err
		}
		if err := l.Sim.SetHardware(PXEMAC(h.Name), hw); err != nil {
			return nil, fmt.Errorf("maas hardware of %s: %w", h.Name, err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("maas simulator: %w", err)
	}
	l.URL = "http://" + ln.Addr().String() + "/MAAS"
	l.srv = &http.Server{Handler: l.Sim, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := l.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			l.log.Error("maas simulator stopped", "err", err)
		}
	}()
	return l, nil
}

// Restart stops the simulator's HTTP server (connections in flight are
// cut, new ones refused), waits down, and serves again on the same
// address with the same state, as a MAAS region restarting on its
// database: machines, faults and the request log survive.
func (l *Lab) Restart(down time.Duration) error {
	addr := strings.TrimSuffix(strings.TrimPrefix(l.URL, "http://"), "/MAAS")
	l.mu.Lock()
	srv := l.srv
	l.mu.Unlock()
	if err := srv.Close(); err != nil {
		return fmt.Errorf("maas simulator restart: %w", err)
	}
	time.Sleep(down)
	var ln net.Listener
	var err error
	for range 50 { // the old socket may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("maas simulator restart on %s: %w", addr, err)
	}
	srv = &http.Server{Handler: l.Sim, ReadHeaderTimeout: 10 * time.Second}
	l.mu.Lock()
	l.srv = srv
	l.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			l.log.Error("maas simulator stopped", "err", err)
		}
	}()
	l.log.Info("maas simulator restarted", "addr", addr, "down", down.String())
	return nil
}

func apiKey() (string, error) {
	parts := make([]string, 3)
	for i := range parts {
		var b [12]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		parts[i] = hex.EncodeToString(b[:])
	}
	return parts[0] + ":" + parts[1] + ":" + parts[2], nil
}

// Close stops the simulator (the bootstrap processes are the
// supervisor's).
func (l *Lab) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.mu.Lock()
	srv := l.srv
	l.mu.Unlock()
	return srv.Shutdown(ctx)
}

// Setup creates the lab site (the simulator's URL and key, sealed by the
// coordinators), publishes the site bootstrap and validation bundles and
// puts the slice and baremetal profiles.
func (l *Lab) Setup(ctx context.Context, api fleet.API) error {
	site := proto.SiteBody{Site: proto.Site{Name: Site, Region: Region,
		Profiles: map[string]string{ProfileSlice: Pool, ProfileBaremetal: Pool}, MAASURL: l.URL,
		PXESubnets:      []string{"10.10.0.0/24"},
		IPoIBPool:       &proto.AddressPool{Subnet: "172.16.0.0/12", First: "172.16.22.1", Last: "172.16.27.254"},
		GuestSubnetPlan: &proto.GuestSubnetPlan{Supernet: "10.200.0.0/16", PrefixLen: 24}, WipePolicy: proto.WipeBlkdiscard},
		MAASAPIKey: l.APIKey}
	if _, err := api.C.Do(ctx, http.MethodPut, "/v1/sites/"+Site, nil, site, nil); err != nil {
		return fmt.Errorf("put site %s: %w", Site, err)
	}
	siteRef, err := publish(ctx, api, "lab-site-bootstrap", proto.BundleSiteBootstrap, []byte(SiteBundle))
	if err != nil {
		return err
	}
	valRef, err := publish(ctx, api, "lab-validation", proto.BundlePostDeployValidation, []byte(ValidationBundle))
	if err != nil {
		return err
	}
	for _, p := range []proto.SiteProfile{
		{Name: ProfileSlice, Intent: proto.IntentSliceVM, BatchMaxParallel: l.cfg.BatchMaxParallel},
		{Name: ProfileBaremetal, Intent: proto.IntentBaremetal, BatchMaxParallel: 1, TenantUserData: TenantUserData},
	} {
		p.Site, p.SiteBootstrapBundleRef, p.PostDeployValidationBundleRef = Site, siteRef, valRef
		p.StrictPXEPreflight, p.FabricMode, p.EnrollmentTokenTTLSeconds = true, proto.FabricIB, 3600
		p.EnableDeployRetryOnDatasourceFailure, p.MaxDeployRetryAttempts = true, 2
		p.ReleaseMode = proto.ReleaseFullDecommission
		if _, err := api.C.Do(ctx, http.MethodPut, "/v1/sites/"+Site+"/profiles/"+p.Name, nil, p, nil); err != nil {
			return fmt.Errorf("put profile %s: %w", p.Name, err)
		}
	}
	return nil
}

// publish uploads a bundle (the body is its bytes) and returns its ref.
func publish(ctx context.Context, api fleet.API, name string, kind proto.BundleKind, content []byte) (string, error) {
	q := url.Values{"name": {name}, "kind": {string(kind)}}
	if _, err := api.C.Do(ctx, http.MethodPost, "/v1/bundles", q, cli.RawBody{ContentType: "application/octet-stream", Data: content}, nil); err != nil {
		return "", fmt.Errorf("publish bundle %s: %w", name, err)
	}
	return proto.BundleDigest(content), nil
}

// ProfileOf is the lab profile of a host.
func ProfileOf(host string) string {
	if host == "j27u15" {
		return ProfileBaremetal
	}
	return ProfileSlice
}

// Onboard starts one onboarding workflow per host (a batch: each
// profile's batch_max_parallel bounds how many run at once) and returns
// their IDs.
func (l *Lab) Onboard(ctx context.Context, api fleet.API, hosts []fleet.Host) ([]string, error) {
	var ids []string
	for _, h := range hosts {
		var w proto.WorkflowView
		r, err := api.C.Do(ctx, http.MethodPost, "/v1/sites/"+Site+"/onboard", nil,
			proto.OnboardBody{Profile: ProfileOf(h.Name), Hostname: h.Name, MACs: []string{PXEMAC(h.Name)}, PowerType: "manual"}, nil)
		if err != nil {
			return ids, fmt.Errorf("onboard %s: %w", h.Name, err)
		}
		if err := jsonUnmarshal(r.Body, &w); err != nil {
			return ids, fmt.Errorf("onboard %s: %w", h.Name, err)
		}
		ids = append(ids, w.ID)
	}
	return ids, nil
}

// Wait waits until every workflow ended and returns them; a failed one
// is an error naming its stage and reason.
func (l *Lab) Wait(ctx context.Context, api fleet.API, ids []string) ([]proto.WorkflowView, error) {
	out := make([]proto.WorkflowView, len(ids))
	for i, id := range ids {
		for {
			r, err := api.C.Do(ctx, http.MethodGet, "/v1/workflows/"+id, nil, nil, nil)
			if err == nil {
				if err := jsonUnmarshal(r.Body, &out[i]); err != nil {
					return out, err
				}
				if out[i].State == proto.WorkflowFailed {
					return out, fmt.Errorf("workflow %s failed at %s: %s%s", id, out[i].Stage, out[i].LastError, l.bootError(out[i].Hostname))
				}
				if out[i].State == proto.WorkflowSucceeded {
					break
				}
			}
			select {
			case <-ctx.Done():
				return out, fmt.Errorf("workflow %s at stage %s: %w%s", id, out[i].Stage, ctx.Err(), l.bootError(out[i].Hostname))
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return out, nil
}

func (l *Lab) bootError(host string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.errs[host]; err != nil {
		return " (first boot: " + err.Error() + ")"
	}
	return ""
}

// Bootstrap returns the gpuaas-bootstrap process of a host (nil before
// its first boot).
func (l *Lab) Bootstrap(host string) *launch.Proc {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.boots[host]
}

// firstBoot plays a deployed host's first boot from the user-data MAAS
// received.
func (l *Lab) firstBoot(d maassim.Deployed) {
	if err := l.boot(d); err != nil {
		l.log.Error("first boot", "host", d.Hostname, "err", err)
		l.mu.Lock()
		l.errs[d.Hostname] = err
		l.mu.Unlock()
	}
}

func (l *Lab) boot(d maassim.Deployed) error {
	i := slices.IndexFunc(l.cfg.Hosts, func(h fleet.Host) bool { return h.Name == d.Hostname })
	if i < 0 {
		return fmt.Errorf("deployed machine %s (%s) is not a lab host", d.SystemID, d.Hostname)
	}
	h := l.cfg.Hosts[i]
	if _, _, err := maasflow.TenantParts(d.UserData); err == nil {
		return l.tenantBoot(h, d)
	}
	cc, err := ParseCloudConfig(d.UserData)
	if err != nil {
		return err
	}
	if err := cc.WriteFilesUnder(h.Root); err != nil {
		return err
	}
	if len(cc.RunCmd) != 1 || filepath.Base(cc.RunCmd[0][0]) != "gpuaas-bootstrap" {
		return fmt.Errorf("runcmd %q: the lab runs exactly one gpuaas-bootstrap command", cc.RunCmd)
	}
	args := []string{l.cfg.BootstrapBin}
	for j, a := range cc.RunCmd[0][1:] {
		if j > 0 && cc.RunCmd[0][j] == "--env-file" {
			a = filepath.Join(h.Root, a) // the host's path under its simulated root
		}
		args = append(args, a)
	}
	agent, err := l.cfg.Agents.Proc(h, "")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(h.StateDir, 0o700); err != nil {
		return err
	}
	args = append(args, "--root", h.Root, "--state-dir", h.StateDir, "--agent-start", "exec",
		"--agent-bin", agent.Args[0], "--agent-log", agent.LogPath, "--poll", "100ms")
	for _, a := range agent.Args[1:] {
		args = append(args, "--agent-arg", a)
	}
	p := &launch.Proc{Name: "bootstrap-" + h.Name, Args: args,
		LogPath: filepath.Join(l.cfg.Agents.LogDir, "bootstrap-"+h.Name+".log")}
	l.mu.Lock()
	l.boots[h.Name] = p
	l.mu.Unlock()
	l.log.Info("first boot: running gpuaas-bootstrap from the user-data", "host", h.Name, "system_id", d.SystemID, "log", p.LogPath)
	return l.cfg.Start(p)
}
