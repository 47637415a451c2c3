package maasflow

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/textproto"
	"strings"

	"github.com/canonical/gomaasclient/entity/node"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/proto"
)

// Baremetal allocations. The coordinator runs an allocation's
// baremetal.handoff and baremetal.release tasks through MAAS (the agent
// of a node cannot redeploy its own host):
//
//	handoff: release (erasing) unless the machine is Ready → deploy with
//	         the tenant's SSH keys and the profile's tenant_user_data,
//	         wait Deployed → done (the workflow records the access)
//	reclaim: release with erase, wait Ready → done
//
// Between tenants a baremetal machine sits Ready (erased) in MAAS. Each
// wait is bounded (DeployExpiry, ReleaseExpiry); a deploy that fails or
// expires ends the workflow failed at once (the tenant asked for a
// machine now, not after five retries). The timeline buckets measured
// are request_accepted_to_workflow_start, ready_to_deploy_wait (start to
// deploy submission, the release of a previous deploy included) and
// image_deploy (deploy submission to Deployed); the server mirrors them
// onto the allocation's timeline.

// TenantUser is the login user of a MAAS-deployed Ubuntu machine.
const TenantUser = "ubuntu"

func (r *Runner) handoffStage(ctx context.Context, w *proto.MAASWorkflow, site *proto.Site, p *proto.SiteProfile) (proto.WorkflowStage, error) {
	mc, err := r.cfg.MAAS(ctx, site)
	if err != nil {
		return "", fmt.Errorf("workflow %s: maas client for site %s: %w", w.ID, site.Name, err)
	}
	if w.SystemID == "" {
		m, err := mc.Resolve(ctx, maas.Query{Hostname: w.Hostname})
		if errors.Is(err, maas.ErrNotFound) {
			return "", permanent{fmt.Errorf("MAAS at site %s has no machine named %s", site.Name, w.Hostname)}
		}
		if err != nil {
			return "", err
		}
		w.SystemID = m.SystemID
		addEvent(w, r.now(), "adopted", fmt.Sprintf("machine %s (%s)", m.SystemID, m.StatusName))
	}
	defer r.copyMAASEvents(ctx, mc, w)
	switch {
	case w.Kind == proto.WorkflowReclaim && w.Stage == proto.StageRelease:
		if err := r.eraseRelease(ctx, mc, w, p, "gpuaas: reclaim from allocation "+w.AllocationID); err != nil {
			return "", err
		}
		return proto.StageDone, nil
	case w.Kind == proto.WorkflowHandoff && w.Stage == proto.StageRelease:
		openBucket(w, proto.BucketReadyToDeploy, r.now())
		m, err := mc.Machine(ctx, w.SystemID)
		if err != nil {
			return "", err
		}
		switch m.Status {
		case node.StatusReady:
			addEvent(w, r.now(), "skipped", "machine is Ready: nothing to release")
		case node.StatusDeploying, node.StatusNew, node.StatusCommissioning, node.StatusBroken:
			return "", permanent{fmt.Errorf("handoff of %s: machine %s is %s in MAAS, not Ready or releasable", w.Hostname, w.SystemID, m.StatusName)}
		default:
			if err := r.eraseRelease(ctx, mc, w, p, "gpuaas: release before handoff to allocation "+w.AllocationID); err != nil {
				return "", err
			}
		}
		return proto.StageDeploy, nil
	case w.Kind == proto.WorkflowHandoff && w.Stage == proto.StageDeploy:
		return proto.StageDone, r.tenantDeploy(ctx, mc, w, p)
	}
	return "", permanent{fmt.Errorf("workflow %s: no %s stage %q", w.ID, w.Kind, w.Stage)}
}

// eraseRelease releases to Ready with erase (falling back to a release
// without erase only where the profile allows it), bounded by
// ReleaseExpiry: an expiry is permanent.
func (r *Runner) eraseRelease(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile, comment string) error {
	err := r.release(ctx, mc, w, p, comment)
	var ee *maas.ExpiredError
	if errors.As(err, &ee) {
		return permanent{err}
	}
	return err
}

// tenantDeploy deploys the machine with the tenant's user-data and waits
// for Deployed; it records the access. A deploy MAAS shows never started
// (the machine left Allocated) is prepared and submitted again, bounded
// by MaxDeployNotStarted.
func (r *Runner) tenantDeploy(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	notStarted := 0
	for {
		err := r.tenantDeployOnce(ctx, mc, w, p)
		if again, err := r.notStarted(w, err, &notStarted); !again {
			return err
		}
	}
}

func (r *Runner) tenantDeployOnce(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	m, err := mc.Machine(ctx, w.SystemID)
	if err != nil {
		return err
	}
	switch m.Status {
	case node.StatusDeployed, node.StatusDeploying:
		// Submitted before (a previous leader): only wait. An Allocated
		// machine has no deploy in flight; it is deployed below.
		now := r.now()
		endBucket(w, proto.BucketReadyToDeploy, now)
		openBucket(w, proto.BucketImageDeploy, now)
	case node.StatusFailedDeployment:
		return permanent{fmt.Errorf("deploy of %s for allocation %s failed: MAAS reports Failed deployment: %s", w.SystemID, w.AllocationID, m.ErrorDescription)}
	default:
		ud, err := RenderTenantUserData(TenantUserData{AllocationID: w.AllocationID, Hostname: w.Hostname,
			SSHPublicKeys: w.SSHPublicKeys, ProfileUserData: p.TenantUserData})
		if err != nil {
			return permanent{err}
		}
		now := r.now()
		endBucket(w, proto.BucketReadyToDeploy, now)
		openBucket(w, proto.BucketImageDeploy, now)
		if err := r.countDeploy(ctx, w); err != nil {
			return err
		}
		params := maas.DeployParams{DistroSeries: r.cfg.DistroSeries, UserData: ud}
		addEvent(w, r.now(), "image_selected", "ubuntu/"+params.DistroSeries)
		if _, err := mc.Deploy(ctx, w.SystemID, params, r.wait(w, r.cfg.DeployExpiry)); err != nil {
			return deployFailure(w, err)
		}
		return r.recordAccess(ctx, mc, w)
	}
	if _, err := mc.Deploy(ctx, w.SystemID, maas.DeployParams{DistroSeries: r.cfg.DistroSeries}, r.wait(w, r.cfg.DeployExpiry)); err != nil {
		return deployFailure(w, err)
	}
	return r.recordAccess(ctx, mc, w)
}

// deployFailure makes a failed or expired tenant deploy permanent.
func deployFailure(w *proto.MAASWorkflow, err error) error {
	var fe *maas.FailedError
	var ee *maas.ExpiredError
	if errors.As(err, &fe) || errors.As(err, &ee) {
		return permanent{fmt.Errorf("deploy for allocation %s: %w", w.AllocationID, err)}
	}
	return err
}

// recordAccess closes the image deploy bucket and records how the tenant
// reaches the machine: its first IP address and boot MAC.
func (r *Runner) recordAccess(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow) error {
	endBucket(w, proto.BucketImageDeploy, r.now())
	m, err := mc.Machine(ctx, w.SystemID)
	if err != nil {
		return err
	}
	if len(m.IPAddresses) == 0 {
		return permanent{fmt.Errorf("machine %s is Deployed but MAAS reports no IP address for it", w.SystemID)}
	}
	ip := m.IPAddresses[0].String()
	acc := &proto.SliceAccess{GuestIP: ip, GuestMAC: strings.ToLower(m.BootInterface.MACAddress), User: TenantUser,
		SSHCommand: "ssh " + TenantUser + "@" + ip}
	if err := acc.Validate(); err != nil {
		return permanent{fmt.Errorf("access to %s: %w", w.SystemID, err)}
	}
	w.Access = acc
	addEvent(w, r.now(), "deployed", fmt.Sprintf("%s deployed for allocation %s at %s", w.SystemID, w.AllocationID, ip))
	return nil
}

// TenantUserData is what a tenant deploy's user-data carries.
type TenantUserData struct {
	AllocationID  string
	Hostname      string
	SSHPublicKeys []string
	// ProfileUserData is the profile's tenant_user_data ("" = none).
	ProfileUserData string
}

// TenantMarkerPath is the file the tenant user-data writes naming the
// allocation (the lab's first boot and tests read it back).
const TenantMarkerPath = "/etc/gpuaas/tenant-allocation"

// RenderTenantUserData renders a tenant deploy's user-data: a MIME
// multipart document (cloud-init's way of combining parts) whose first
// part is a #cloud-config with the tenant's SSH keys and a marker file
// naming the allocation, and whose second part, if any, is the profile's
// tenant_user_data verbatim. The boundary derives from the content, so
// the same inputs render the same bytes.
func RenderTenantUserData(u TenantUserData) ([]byte, error) {
	if err := proto.ValidateID("allocation id", u.AllocationID); err != nil {
		return nil, err
	}
	var cc strings.Builder
	cc.WriteString("#cloud-config\n")
	if len(u.SSHPublicKeys) > 0 {
		cc.WriteString("ssh_authorized_keys:\n")
		for i, k := range u.SSHPublicKeys {
			if strings.ContainsAny(k, "\r\n\"\\") || strings.TrimSpace(k) == "" {
				return nil, fmt.Errorf("render tenant user-data: ssh key %d is empty or holds a newline, quote or backslash", i)
			}
			fmt.Fprintf(&cc, "  - \"%s\"\n", k)
		}
	}
	fmt.Fprintf(&cc, "write_files:\n  - path: %s\n    permissions: '0644'\n    content: |\n      allocation=%s\n      hostname=%s\n", TenantMarkerPath, u.AllocationID, u.Hostname)
	parts := []struct{ ctype, body string }{{"text/cloud-config", cc.String()}}
	switch pu := u.ProfileUserData; {
	case pu == "":
	case strings.HasPrefix(pu, "#cloud-config\n"):
		parts = append(parts, struct{ ctype, body string }{"text/cloud-config", pu})
	case strings.HasPrefix(pu, "#!"):
		parts = append(parts, struct{ ctype, body string }{"text/x-shellscript", pu})
	default:
		return nil, fmt.Errorf("render tenant user-data: the profile's tenant_user_data must start with #cloud-config or #! (a script)")
	}
	sum := sha256.New()
	for _, p := range parts {
		sum.Write([]byte(p.body))
	}
	boundary := "gpuaas-" + hex.EncodeToString(sum.Sum(nil)[:12])
	var b bytes.Buffer
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=\"%s\"\nMIME-Version: 1.0\n\n", boundary)
	mw := multipart.NewWriter(&b)
	if err := mw.SetBoundary(boundary); err != nil {
		return nil, err
	}
	for i, p := range parts {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", p.ctype+"; charset=\"utf-8\"")
		h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=\"part-%d\"", i+1))
		pw, err := mw.CreatePart(h)
		if err != nil {
			return nil, err
		}
		if _, err := pw.Write([]byte(p.body)); err != nil {
			return nil, err
		}
	}
	if err := mw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// TenantParts splits a tenant user-data document into its parts' content
// types and bodies (the lab's first boot and tests read deploys back).
func TenantParts(ud []byte) (ctypes, bodies []string, err error) {
	head, rest, ok := bytes.Cut(ud, []byte("\n\n"))
	if !ok {
		return nil, nil, fmt.Errorf("tenant user-data: no MIME header")
	}
	_, params, found := strings.Cut(string(head), "boundary=\"")
	if !found {
		return nil, nil, fmt.Errorf("tenant user-data: not multipart")
	}
	boundary, _, _ := strings.Cut(params, "\"")
	mr := multipart.NewReader(bytes.NewReader(rest), boundary)
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return ctypes, bodies, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("tenant user-data: %w", err)
		}
		var body bytes.Buffer
		if _, err := body.ReadFrom(p); err != nil {
			return nil, nil, fmt.Errorf("tenant user-data: %w", err)
		}
		ct, _, _ := strings.Cut(p.Header.Get("Content-Type"), ";")
		ctypes, bodies = append(ctypes, ct), append(bodies, body.String())
	}
}
