package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/labhost"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/maaslab"
	"github.com/gpuaas/gpuaas/proto"
)

// realSliceHost is the lab host whose agent runs the real slice runtime.
const realSliceHost = "j22u15"

// Lab guest image catalog entry.
const (
	labImageName    = "lab-guest"
	labImageVersion = "v1"
)

// sliceMode is how -slice-host resolved for this run and, when j22u15
// stays simulated, the real cause. It is printed in the summary and kept
// in run.json.
type sliceMode struct {
	Flag string `json:"flag"` // auto, real or none, as given
	Real bool   `json:"real"` // j22u15 boots real VMs
	// Cause says why j22u15 is simulated ("" when Real).
	Cause string `json:"cause,omitempty"`
}

// resolveSliceHost decides whether j22u15 tries to boot real VMs: "auto"
// does when this process is root and libvirt/QEMU/OVS/dnsmasq are
// installed, "real" requires it (a missing part is then an error), "none"
// keeps every host simulated. setupFailed later turns a failed attempt
// into simulated, with the error as the cause.
func resolveSliceHost(flag string, euid int, installed func() error) (sliceMode, error) {
	m := sliceMode{Flag: flag}
	switch flag {
	case "none":
		m.Cause = "-slice-host none keeps every host simulated"
	case "real":
		m.Real = true
	case "auto":
		if euid != 0 {
			m.Cause = "not root: real VMs need root (run make lab as root, or check with gpuaas-lab doctor)"
			break
		}
		if err := installed(); err != nil {
			m.Cause = err.Error() + " (make deps installs it; gpuaas-lab doctor lists what is missing)"
			break
		}
		m.Real = true
	default:
		return m, fmt.Errorf("-slice-host %q: use auto, real or none", flag)
	}
	return m, nil
}

// setupFailed records that the real slice host could not be set up.
func (m *sliceMode) setupFailed(err error) {
	m.Real = false
	m.Cause = "setting up the real slice host failed: " + err.Error()
}

// describe is the summary's slice-host line.
func (m sliceMode) describe() string {
	if m.Real {
		return fmt.Sprintf("-slice-host %s: real VMs on %s (root; libvirt, QEMU, OVS and dnsmasq set up; the lab guest images published)", m.Flag, realSliceHost)
	}
	return fmt.Sprintf("-slice-host %s: simulated (%s)", m.Flag, m.Cause)
}

// hostMode is a host's column in the summary: whether it boots real VMs.
func (m sliceMode) hostMode(host string, intent proto.ProfileIntent) string {
	switch {
	case intent == proto.IntentBaremetal:
		return "simulated"
	case host == realSliceHost && m.Real:
		return "real VMs"
	}
	return "simulated"
}

// setupSliceHost binds j22u15's NVMe disks to loop devices, makes sure the
// shared Open vSwitch and libvirtd run, creates its bridge (name and guest
// the agents' default guest subnet, so slots approved earlier keep valid
// addresses) and returns the host, closed on exit.
func setupSliceHost(ctx context.Context, log *slog.Logger, dir string, h fleet.Host) (*labhost.SliceHost, error) {
	if _, err := fleet.EnsureRoot(h); err != nil {
		return nil, err
	}
	root, err := hostops.NewRoot(h.Root)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(dir))
	sh, err := labhost.SetupSlice(ctx, labhost.SliceOptions{
		Root: root, Dir: filepath.Join(dir, "slicehost", h.Name),
		Bridge: fmt.Sprintf("gpl%x", sum[:2]),
		// The agents' default guest subnet: slots approved while the host
		// ran simulated keep valid addresses when it runs for real.
		Gateway: config.Defaults().GuestGateway,
	}, func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...)) })
	if err != nil {
		return nil, err
	}
	log.Info("real slice host ready", "host", h.Name, "bridge", sh.Slice.Bridge, "gateway", sh.Slice.Gateway, "disks", len(sh.Loops))
	return sh, nil
}

// Lab CUDA developer image catalog entry.
const labCUDAImageName = "lab-guest-cuda"

// labImage is one lab guest flavour the lab publishes and approves.
type labImage struct {
	name, version string
	variant       string // images/guest variant (its manifest names the catalog kind)
	note          string
}

// labImages are published side by side: the small base guest and the CUDA
// developer guest (base + qemu_fw_cfg + simulated nvidia-smi, readiness
// check "cuda").
var labImages = []labImage{
	{labImageName, labImageVersion, guest.VariantBase, "lab guest (u-root), published by gpuaas-lab"},
	{labCUDAImageName, labImageVersion, guest.VariantCUDA,
		"lab CUDA developer guest (u-root + simulated nvidia-smi over fw_cfg), published by gpuaas-lab"},
}

// publishGuestImage builds (or finds cached) the lab guest images and puts
// them in the catalog, approved, unless they are there already; it
// returns the base image's name.
func publishGuestImage(ctx context.Context, log *slog.Logger, api fleet.API) (string, error) {
	for _, im := range labImages {
		if err := publishLabImage(ctx, log, api, im, guest.Image); err != nil {
			return "", err
		}
	}
	return labImageName, nil
}

// imageBuilder builds (or finds cached) a lab guest image: guest.Image.
type imageBuilder func(ctx context.Context, o guest.Options) (guest.Manifest, string, error)

func publishLabImage(ctx context.Context, log *slog.Logger, api fleet.API, im labImage, build imageBuilder) error {
	m, img, err := build(ctx, guest.Options{Variant: im.variant, Log: log})
	if err != nil {
		return fmt.Errorf("lab guest image %s: %w", im.name, err)
	}
	path := "/v1/images/" + im.name + "/" + im.version
	digest := "sha256:" + m.SHA256
	var have proto.Image
	r, err := api.C.Do(ctx, http.MethodGet, path, nil, nil, nil)
	switch {
	case err == nil:
		if err := jsonDecode(r.Body, &have); err != nil {
			return err
		}
		if have.Digest != digest {
			return fmt.Errorf("catalog %s:%s has digest %s, the lab guest image is %s: run gpuaas-lab -fresh", im.name, im.version, have.Digest, digest)
		}
		if have.State == proto.ImageApproved {
			return nil
		}
	case cli.IsProblem(err, proto.CodeNotFound):
		kind := m.CatalogKind
		if kind == "" {
			// A manifest cached before every variant named its kind.
			kind = guest.Variants[im.variant].CatalogKind
		}
		body := proto.ImageBody{Kind: proto.ImageKind(kind), Digest: digest, Size: m.Size, MarkerSHA256: m.MarkerSHA256, ReadinessCheck: m.ReadinessCheck}
		if _, err := api.C.Do(ctx, http.MethodPut, path, nil, body, nil); err != nil {
			return fmt.Errorf("catalog entry %s: %w", im.name, err)
		}
	default:
		return err
	}
	data, err := os.ReadFile(img)
	if err != nil {
		return err
	}
	if _, err := api.C.Do(ctx, http.MethodPut, path+"/blob", nil, cli.RawBody{ContentType: "application/octet-stream", Data: data}, nil); err != nil {
		return fmt.Errorf("upload the lab guest image %s: %w", im.name, err)
	}
	if _, err := api.C.Do(ctx, http.MethodPost, path+"/approve", nil, proto.ImageApproveBody{Note: im.note}, nil); err != nil {
		return fmt.Errorf("approve the lab guest image %s: %w", im.name, err)
	}
	log.Info("published a lab guest image", "image", im.name+":"+im.version, "kind", m.CatalogKind, "readiness_check", m.ReadinessCheck, "digest", digest)
	return nil
}

// sliceHint tells the operator how to take a slice; key is the tenant
// key the README's commands use (made once, in the lab folder).
func sliceHint(out io.Writer, sh *labhost.SliceHost, image string, mode sliceMode, key string) {
	if sh == nil {
		fmt.Fprintf(out, "Slices: every host is simulated: %s.\n", mode.Cause)
		fmt.Fprintf(out, "  (slices run on the simulated slice runtime, lab/simslice: the same stages and wipe proofs, no VM boots; gpuaas-lab doctor checks what real VMs on %s need)\n", realSliceHost)
		fmt.Fprintf(out, "  bin/gpuaasctl alloc console ID   # a simulated serial console through the gateway (root / gpuaas-lab; Ctrl-] leaves)\n\n")
		return
	}
	fmt.Fprintf(out, "Slices: %s boots real VMs (libvirt/QEMU TCG, userspace OVS bridge %s, guest subnet %s, NVMe disks on loop devices).\n",
		realSliceHost, sh.Slice.Bridge, sh.Slice.Gateway)
	fmt.Fprintf(out, "  [ -f %s ] || ssh-keygen -q -t ed25519 -N '' -f %s   # once\n", key, key)
	fmt.Fprintf(out, "  bin/gpuaasctl alloc create --gpus 1 --region lab-east --image %s --ssh-key \"$(cat %s.pub)\" --wait\n", image, key)
	fmt.Fprintf(out, "  bin/gpuaasctl alloc ssh ID -i %s   # the guest's host key pinned; the guest subnet is on this machine\n", key)
	fmt.Fprintf(out, "  bin/gpuaasctl alloc console ID   # the serial console through the gateway (root / gpuaas-lab; Ctrl-] leaves)\n")
	fmt.Fprintf(out, "  # CUDA developer image (readiness runs nvidia-smi; the lab announces the GPUs over fw_cfg):\n")
	fmt.Fprintf(out, "  bin/gpuaasctl alloc create --gpus 1 --region lab-east --image %s --ssh-key \"$(cat %s.pub)\" --wait\n", labCUDAImageName, key)
	fmt.Fprintf(out, "  bin/gpuaasctl alloc release ID --wait; bin/gpuaasctl slot list --node %s\n\n", realSliceHost)
}

func jsonDecode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", strings.TrimSpace(string(b[:min(len(b), 80)])), err)
	}
	return nil
}

// The lab's public ingress (README "Public ingress"): j22u15's agent
// programs its DNAT in this machine's namespace (launch.SetupIngress),
// and the lab site declares a pool of one address with a port range.
const (
	labIngressAddress = "203.0.113.10"
	labIngressFirst   = 40000
	labIngressLast    = 40099
)

// ingressName is the name of the lab's ingress namespaces (one per lab
// folder, so labs in two folders do not collide).
func ingressName(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return fmt.Sprintf("gpi-%x", sum[:2])
}

// setupIngress creates the lab's ingress namespaces for the real slice
// host's agent; the caller closes it after the agents stopped.
func setupIngress(ctx context.Context, log *slog.Logger, dir string) (*launch.LabIngress, error) {
	li, err := launch.SetupIngress(ctx, launch.IngressOptions{Name: ingressName(dir)})
	if err != nil {
		return nil, err
	}
	log.Info("public ingress ready", "host", realSliceHost, "netns", li.Netns, "public_side", li.PublicNetns)
	return li, nil
}

// declareIngress gives the lab site its ingress pool (unless it has one:
// an operator's own declaration stays). Without the lab site (no
// baremetal host in -hosts) there is nothing to declare.
func declareIngress(ctx context.Context, api fleet.API) error {
	var sv proto.SiteView
	r, err := api.C.Do(ctx, http.MethodGet, "/v1/sites/"+maaslab.Site, nil, nil, nil)
	switch {
	case cli.IsProblem(err, proto.CodeNotFound):
		return nil
	case err != nil:
		return err
	}
	if err := jsonDecode(r.Body, &sv); err != nil {
		return err
	}
	if sv.Ingress != nil {
		return nil
	}
	body := proto.SiteIngressBody{Ingress: &proto.SiteIngress{Addresses: []string{labIngressAddress},
		PublicPorts: &proto.PortRange{First: labIngressFirst, Last: labIngressLast}, Protocols: []string{"tcp", "udp"},
		AllowedPorts: []proto.PortRange{{First: 1, Last: 65535}}, QuotaPerTenant: 8}}
	if _, err := api.C.Do(ctx, http.MethodPut, "/v1/sites/"+maaslab.Site+"/ingress", nil, body, nil); err != nil {
		return fmt.Errorf("declare the lab site's ingress: %w", err)
	}
	return nil
}

// ingressHint tells the operator how to reach a slice from the public side.
func ingressHint(out io.Writer, li *launch.LabIngress) {
	if li == nil {
		return
	}
	fmt.Fprintf(out, "Public ingress: site %s hands out %s:%d-%d; %s's agent programs the DNAT (namespace %s); the public side is namespace %s.\n",
		maaslab.Site, labIngressAddress, labIngressFirst, labIngressLast, realSliceHost, li.Netns, li.PublicNetns)
	fmt.Fprintf(out, "  bin/gpuaasctl alloc ingress add ID tcp/8888; bin/gpuaasctl alloc ingress list ID   # PUBLIC %s:%d ... programmed\n", labIngressAddress, labIngressFirst)
	fmt.Fprintf(out, "  ip netns exec %s curl http://%s:%d/   # from the public side (simulated hosts' routes fail: they are simulated)\n\n", li.PublicNetns, labIngressAddress, labIngressFirst)
}
