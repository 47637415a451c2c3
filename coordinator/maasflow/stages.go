package maasflow

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/canonical/gomaasclient/entity/node"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/proto"
)

// runStage runs w's current stage (w is a private copy the stage may
// change: system ID, buckets, events) and returns the next stage.
func (r *Runner) runStage(ctx context.Context, w *proto.MAASWorkflow) (proto.WorkflowStage, error) {
	snap := r.cfg.Ledger.Store().Snapshot()
	site, ok := snap.Site(w.Site)
	if !ok {
		return "", permanent{fmt.Errorf("workflow %s: site %s no longer exists", w.ID, w.Site)}
	}
	profile, ok := snap.SiteProfile(w.Site, w.Profile)
	if !ok {
		return "", permanent{fmt.Errorf("workflow %s: profile %s/%s no longer exists", w.ID, w.Site, w.Profile)}
	}
	switch w.Kind {
	case proto.WorkflowDecommission:
		return r.decommissionStage(ctx, w, site, profile)
	case proto.WorkflowHandoff, proto.WorkflowReclaim:
		return r.handoffStage(ctx, w, site, profile)
	}
	if w.Stage == proto.StageRegister {
		return proto.StageDeploy, r.register(ctx, w, site, profile)
	}
	mc, err := r.cfg.MAAS(ctx, site)
	if err != nil {
		return "", fmt.Errorf("workflow %s: maas client for site %s: %w", w.ID, site.Name, err)
	}
	switch w.Stage {
	case proto.StageResolve:
		return proto.StageCommission, r.resolve(ctx, mc, w, profile)
	case proto.StageCommission:
		defer r.copyMAASEvents(ctx, mc, w)
		return proto.StageTag, r.commission(ctx, mc, w)
	case proto.StageTag:
		return proto.StagePXE, r.tag(ctx, mc, w, profile)
	case proto.StagePXE:
		return proto.StageStorage, r.pxePreflight(ctx, mc, w, site, profile)
	case proto.StageStorage:
		return proto.StageRoCE, r.storage(ctx, mc, w, profile)
	case proto.StageRoCE:
		return proto.StageRegister, r.roce(ctx, mc, w, site, profile)
	case proto.StageDeploy:
		defer r.copyMAASEvents(ctx, mc, w)
		return proto.StageHWSync, r.deploy(ctx, mc, w, site, profile)
	case proto.StageHWSync:
		return proto.StageEnroll, r.hwSync(ctx, mc, w, profile)
	case proto.StageEnroll:
		return proto.StageValidate, r.enrollGate(ctx, w, profile)
	case proto.StageValidate:
		return proto.StageReady, r.validateGate(ctx, w, profile)
	case proto.StageReady:
		return proto.StageDone, r.readyGate(ctx, w, profile)
	}
	return "", permanent{fmt.Errorf("workflow %s: no stage %q", w.ID, w.Stage)}
}

// resolve finds the machine by MAC, hostname or BMC, or creates it.
func (r *Runner) resolve(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	queries := []maas.Query{{MAC: w.MACs[0]}, {Hostname: w.Hostname}}
	if w.BMCAddress != "" {
		queries = append(queries, maas.Query{BMC: w.BMCAddress})
	}
	var m *maas.Machine
	for _, q := range queries {
		found, err := mc.Resolve(ctx, q)
		if errors.Is(err, maas.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		m = found
		addEvent(w, r.now(), "adopted", fmt.Sprintf("machine %s found by %s (%s)", found.SystemID, q, found.StatusName))
		break
	}
	if m == nil && p.AutoClaimSingleNewMachine {
		news, err := mc.MachinesInStatus(ctx, "new")
		if err != nil {
			return err
		}
		switch len(news) {
		case 0:
		case 1:
			if err := mc.SetHostname(ctx, news[0].SystemID, w.Hostname); err != nil {
				return err
			}
			if m, err = mc.Machine(ctx, news[0].SystemID); err != nil {
				return err
			}
			addEvent(w, r.now(), "auto_claimed", fmt.Sprintf("the single New machine %s (was %s) claimed as %s", m.SystemID, news[0].Hostname, w.Hostname))
		default:
			return permanent{fmt.Errorf("resolve %s: no machine matches and %d machines are New; auto_claim_single_new_machine claims only a single one", w.Hostname, len(news))}
		}
	}
	if m == nil {
		pp := map[string]string{}
		if w.BMCAddress != "" {
			pp["power_address"] = w.BMCAddress
		}
		created, err := mc.Create(ctx, maas.CreateParams{Hostname: w.Hostname, MACs: w.MACs, PowerType: w.PowerType, PowerParams: pp})
		if err != nil {
			// On an unknown outcome the next attempt finds it by MAC.
			return err
		}
		m = created
		addEvent(w, r.now(), "created", "machine "+created.SystemID)
	}
	w.SystemID = m.SystemID
	now := r.now()
	endBucket(w, proto.BucketDiscovery, now)
	openBucket(w, proto.BucketCommission, now)
	return nil
}

func (r *Runner) wait(w *proto.MAASWorkflow, expiry time.Duration) maas.Wait {
	return maas.Wait{Expiry: expiry, OnProgress: func(p maas.ProgressEvent) {
		switch p.Kind {
		case maas.ProgressUnknownOutcome:
			addEvent(w, r.now(), "unknown_outcome", p.Op+": "+p.Detail)
		case maas.ProgressAlready:
			addEvent(w, r.now(), "resumed", p.Op+" already under way ("+p.Detail+")")
		}
	}}
}

func (r *Runner) commission(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow) error {
	if _, err := mc.Commission(ctx, w.SystemID, maas.CommissionParams{}, r.wait(w, r.cfg.CommissionExpiry)); err != nil {
		return err
	}
	now := r.now()
	endBucket(w, proto.BucketCommission, now)
	openBucket(w, proto.BucketReadyToDeploy, now)
	return nil
}

// IntentTag is the MAAS tag of a profile intent.
func IntentTag(i proto.ProfileIntent) string {
	return "gpuaas-profile-" + strings.ReplaceAll(string(i), "_", "-")
}

func (r *Runner) tag(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	return mc.EnsureTag(ctx, w.SystemID, IntentTag(p.Intent), "GPUaaS profile intent")
}

// register puts the node in the ledger, in its profile's pool.
func (r *Runner) register(ctx context.Context, w *proto.MAASWorkflow, site *proto.Site, p *proto.SiteProfile) error {
	n := proto.Node{ID: w.Hostname, Hostname: w.Hostname, Region: site.Region, Pool: site.Profiles[p.Name], ProfileIntent: p.Intent}
	_, _, err := r.cfg.Ledger.Apply(ctx, proto.NodeUpsertType, proto.NodeUpsertRequest{At: r.now(), Node: n})
	if err != nil && proto.CodeOf(err) != proto.CodeUnavailable && proto.CodeOf(err) != proto.CodeInternal {
		return permanent{fmt.Errorf("register node %s: %w", n.ID, err)}
	}
	return err
}

// deploy deploys with a fresh bootstrap token and waits for Deployed. A
// datasource failure (MAAS's deploy timeout) is retried through release →
// Ready → deploy while the profile allows it; other failures end the
// workflow. The attempt count is recorded before each submission, so a
// failover never exceeds the budget.
func (r *Runner) deploy(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, site *proto.Site, p *proto.SiteProfile) error {
	notStarted := 0
	for {
		m, err := mc.Machine(ctx, w.SystemID)
		if err != nil {
			return err
		}
		params := maas.DeployParams{DistroSeries: r.cfg.DistroSeries, EnableHwSync: p.RequireHWSync}
		switch m.Status {
		case node.StatusDeployed, node.StatusDeploying:
			// Submitted before (perhaps by a previous leader): only wait.
			// (Allocated is not here: it means no deploy is in flight, so
			// the deploy is prepared and submitted again below.)
			// The buckets were recorded with the deploy count; if not
			// (an older record), they start now.
			now := r.now()
			endBucket(w, proto.BucketReadyToDeploy, now)
			openBucket(w, proto.BucketImageDeploy, now)
		case node.StatusFailedDeployment:
			if err := r.retryAfterFailure(ctx, mc, w, p, m); err != nil {
				return err
			}
			continue
		default:
			// The bucket marks are recorded with the deploy count, before
			// the submission, so a new leader finds them; the image
			// deploy bucket opens before the token is minted (the
			// bootstrap reports are those of tokens minted after it).
			now := r.now()
			endBucket(w, proto.BucketReadyToDeploy, now)
			openBucket(w, proto.BucketImageDeploy, now)
			in, err := r.userData(ctx, w, site, p)
			if err != nil {
				return err
			}
			checks, img := r.predeploy(ctx, mc, w, in)
			w.Predeploy = checks
			for _, c := range checks {
				if !c.OK {
					addEvent(w, r.now(), "predeploy_failed", c.String())
					return permanent{fmt.Errorf("predeploy check %s failed: %s (no deploy call was made)", c.Name, c.Detail)}
				}
			}
			addEvent(w, r.now(), "predeploy_ok", fmt.Sprintf("all %d predeploy checks passed", len(checks)))
			if img != nil {
				params.DistroSeries = img.Name
				addEvent(w, r.now(), "image_selected", img.Name+" "+img.Version)
			} else {
				addEvent(w, r.now(), "image_selected", "ubuntu/"+params.DistroSeries)
			}
			params.UserData = in.rendered
			if err := r.countDeploy(ctx, w); err != nil {
				return err
			}
		}
		_, err = mc.Deploy(ctx, w.SystemID, params, r.wait(w, r.cfg.DeployExpiry))
		var fe *maas.FailedError
		if errors.As(err, &fe) && fe.Status == node.StatusFailedDeployment {
			continue // classified by retryAfterFailure on the next turn
		}
		if again, err := r.notStarted(w, err, &notStarted); again {
			continue // Allocated with nothing in flight: prepared and submitted again
		} else if err != nil {
			return err
		}
		if err != nil {
			return err
		}
		now := r.now()
		endBucket(w, proto.BucketImageDeploy, now)
		if w.Kind == proto.WorkflowOnboard {
			openBucket(w, proto.BucketFirstBootCloudInit, now) // the node's callbacks close it
		}
		return nil
	}
}

// MaxDeployNotStarted bounds how often one deploy stage prepares and
// submits a deploy again after MAAS showed the previous submission never
// started (the machine stayed Allocated): the lost submissions are not
// deploy attempts (nothing ran), but they are not retried forever.
const MaxDeployNotStarted = 3

// notStarted classifies a deploy error: a maas.NotStartedError (the
// machine is Allocated with no deploy in flight, seen within two polls
// of the submission) means prepare and submit again, at most
// MaxDeployNotStarted times; then the stage fails permanently, named.
// Any other error is returned as it is.
func (r *Runner) notStarted(w *proto.MAASWorkflow, err error, count *int) (bool, error) {
	var ns *maas.NotStartedError
	if !errors.As(err, &ns) {
		return false, err
	}
	*count++
	if *count > MaxDeployNotStarted {
		return false, permanent{fmt.Errorf("deploy of %s never started: MAAS left it %s after %d submissions", w.SystemID, ns.StatusName, *count)}
	}
	addEvent(w, r.now(), "deploy_not_started", ns.Error()+"; preparing and submitting the deploy again")
	return true, nil
}

// datasourceFailure reports whether a failed deployment is the datasource
// case (MAAS timed the deployment out waiting for the node's first boot
// to report back), the one failure a redeploy can cure.
func datasourceFailure(desc string) bool {
	return strings.Contains(desc, "timed out")
}

func (r *Runner) retryAfterFailure(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile, m *maas.Machine) error {
	reason := fmt.Sprintf("deploy of %s failed (%s)", w.SystemID, m.ErrorDescription)
	switch {
	case !datasourceFailure(m.ErrorDescription):
		return permanent{fmt.Errorf("%s: not a datasource failure, not retried", reason)}
	case !p.EnableDeployRetryOnDatasourceFailure:
		return permanent{fmt.Errorf("%s: datasource failure; enable_deploy_retry_on_datasource_failure is off", reason)}
	case w.DeployAttempts > p.MaxDeployRetryAttempts:
		return permanent{fmt.Errorf("%s: datasource failure; gave up after %d deploy attempts (max_deploy_retry_attempts %d)", reason, w.DeployAttempts, p.MaxDeployRetryAttempts)}
	}
	addEvent(w, r.now(), "datasource_retry", fmt.Sprintf("%s: release to Ready, then deploy attempt %d", reason, w.DeployAttempts+1))
	_, err := mc.Release(ctx, w.SystemID, maas.ReleaseParams{Comment: "gpuaas: datasource retry"}, r.wait(w, r.cfg.ReleaseExpiry))
	return err
}

// countDeploy durably counts one more deploy submission before it is made.
func (r *Runner) countDeploy(ctx context.Context, w *proto.MAASWorkflow) error {
	prev, ok := r.cfg.Ledger.Store().Snapshot().MAASWorkflow(w.ID)
	if !ok {
		return permanent{fmt.Errorf("workflow %s vanished", w.ID)}
	}
	w.DeployAttempts++
	addEvent(w, r.now(), "deploy_submit", fmt.Sprintf("deploy attempt %d", w.DeployAttempts))
	saved, err := r.update(ctx, prev, *w)
	if err != nil {
		w.DeployAttempts--
		return err
	}
	// Keep working on what is stored (the caller's final update expects
	// its ModifyIndex).
	*w = *saved
	w.Buckets = append([]proto.BucketSpan(nil), saved.Buckets...)
	w.Events = append([]proto.WorkflowEvent(nil), saved.Events...)
	return nil
}

// userData mints a single-use bootstrap token for the node (TTL from the
// profile's enrollment_token_ttl_seconds) and renders the cloud-init
// document that runs gpuaas-bootstrap with it.
func (r *Runner) userData(ctx context.Context, w *proto.MAASWorkflow, site *proto.Site, p *proto.SiteProfile) (predeployInput, error) {
	tok := enroll.NewSecret("gpb_")
	now := r.now()
	ttl := time.Duration(p.EnrollmentTokenTTLSeconds) * time.Second
	req := proto.BootstrapTokenMintRequest{At: now, NodeID: w.Hostname, TokenHash: enroll.Hash(tok), ExpiresAt: now.Add(ttl)}
	if _, _, err := r.cfg.Ledger.Apply(ctx, proto.BootstrapTokenMintType|proto.IgnoreUnknownTypeFlag, req); err != nil {
		return predeployInput{}, fmt.Errorf("mint bootstrap token for %s: %w", w.Hostname, err)
	}
	ud := UserData{CoordinatorURL: r.cfg.CoordinatorURL, NodeID: w.Hostname, Token: tok,
		SiteBundleRef: p.SiteBootstrapBundleRef, ValidationBundleRef: p.PostDeployValidationBundleRef,
		FabricMode: p.FabricMode, CABundle: site.CABundle, WorkflowID: w.ID}
	b, err := RenderUserData(ud)
	if err != nil {
		return predeployInput{}, permanent{err}
	}
	return predeployInput{site: site, profile: p, ud: ud, rendered: b, mintedAt: now}, nil
}

// copyMAASEvents copies the machine's MAAS INFO (and higher) events since
// the last copied one into the workflow's events, oldest first: the MAAS
// side of the stage window that just ran. A failed read is logged only.
func (r *Runner) copyMAASEvents(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow) {
	if w.SystemID == "" || ctx.Err() != nil {
		return
	}
	evs, err := mc.Events(ctx, w.SystemID, "INFO", w.MAASEventsAfter)
	if err != nil {
		r.log.Warn("copy maas events", "workflow", w.ID, "system_id", w.SystemID, "err", err)
		return
	}
	for i := len(evs) - 1; i >= 0; i-- {
		e := evs[i]
		if e.ID <= w.MAASEventsAfter {
			continue
		}
		detail := e.Type
		if e.Description != "" {
			detail += ": " + e.Description
		}
		addEvent(w, r.now(), "maas_"+strings.ToLower(string(e.Level)), detail)
		w.MAASEventsAfter = e.ID
	}
}

// pxePreflight checks that the machine's boot (PXE) interface is linked
// to one of the site's PXE subnets. With strict_pxe_preflight a mismatch
// stops the workflow before deploy; without it, it is recorded.
func (r *Runner) pxePreflight(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, site *proto.Site, p *proto.SiteProfile) error {
	m, err := mc.Machine(ctx, w.SystemID)
	if err != nil {
		return err
	}
	bi := m.BootInterface
	var seen []string
	for _, l := range bi.Links {
		seen = append(seen, l.Subnet.CIDR)
		pfx, err := netip.ParsePrefix(l.Subnet.CIDR)
		if err != nil {
			continue
		}
		for _, c := range site.PXESubnets {
			if q, err := netip.ParsePrefix(c); err == nil && q.Masked() == pfx.Masked() {
				addEvent(w, r.now(), "pxe_ok", fmt.Sprintf("boot interface %s (%s) on PXE subnet %s", bi.Name, bi.MACAddress, c))
				return nil
			}
		}
	}
	msg := fmt.Sprintf("PXE preflight: boot interface %q (%s) is linked to %v, none of the site's PXE subnets %v", bi.Name, bi.MACAddress, seen, site.PXESubnets)
	if p.StrictPXEPreflight {
		return permanent{fmt.Errorf("%s (strict_pxe_preflight)", msg)}
	}
	addEvent(w, r.now(), "pxe_warning", msg)
	return nil
}

// storage selects the boot disk (a BOSS device when there is one, else
// MAAS's choice) and applies the profile's storage layout with / on it;
// both are verified by read-back. No storage_layout_profile: MAAS's
// default layout stays.
func (r *Runner) storage(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	if p.StorageLayoutProfile == "" {
		addEvent(w, r.now(), "skipped", "no storage_layout_profile: MAAS default layout")
		return nil
	}
	bds, err := mc.BlockDevices(ctx, w.SystemID)
	if err != nil {
		return err
	}
	m, err := mc.Machine(ctx, w.SystemID)
	if err != nil {
		return err
	}
	boot := m.BootDisk.ID
	for _, bd := range bds {
		if strings.Contains(strings.ToUpper(bd.Model), "BOSS") {
			boot = bd.ID
			break
		}
	}
	if boot == 0 {
		return permanent{fmt.Errorf("storage of %s: no boot disk (MAAS reports none and no BOSS device)", w.SystemID)}
	}
	if err := mc.SetBootDisk(ctx, w.SystemID, boot); err != nil {
		return err
	}
	if err := mc.SetStorageLayout(ctx, w.SystemID, p.StorageLayoutProfile, boot); err != nil {
		return err
	}
	addEvent(w, r.now(), "storage", fmt.Sprintf("boot disk %d, layout %s", boot, p.StorageLayoutProfile))
	return nil
}

// roce gives the machine its phase-2 RoCE address before deploy: the
// ledger assigns the lowest free address of the site's roce_pool
// (recorded before MAAS is touched, unique per site), then link_subnet
// puts it statically on the first non-boot interface, verified by
// read-back. Only with enable_phase2_roce.
func (r *Runner) roce(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, site *proto.Site, p *proto.SiteProfile) error {
	if !p.EnablePhase2RoCE {
		addEvent(w, r.now(), "skipped", "enable_phase2_roce is off")
		return nil
	}
	if site.RoCEPool == nil {
		return permanent{fmt.Errorf("phase-2 RoCE: site %s has no roce_pool", site.Name)}
	}
	if w.RoCEAddress == "" {
		addr, err := r.freeRoCEAddress(site)
		if err != nil {
			return err
		}
		prev, ok := r.cfg.Ledger.Store().Snapshot().MAASWorkflow(w.ID)
		if !ok {
			return permanent{fmt.Errorf("workflow %s vanished", w.ID)}
		}
		w.RoCEAddress = addr
		addEvent(w, r.now(), "roce_assigned", addr)
		saved, err := r.update(ctx, prev, *w)
		if err != nil {
			w.RoCEAddress = ""
			return err
		}
		*w = *saved
		w.Buckets = append([]proto.BucketSpan(nil), saved.Buckets...)
		w.Events = append([]proto.WorkflowEvent(nil), saved.Events...)
	}
	subnet, err := mc.SubnetByCIDR(ctx, site.RoCEPool.Subnet)
	if err != nil {
		return permanent{fmt.Errorf("phase-2 RoCE: %w", err)}
	}
	m, err := mc.Machine(ctx, w.SystemID)
	if err != nil {
		return err
	}
	ifs, err := mc.Interfaces(ctx, w.SystemID)
	if err != nil {
		return err
	}
	iface := -1
	for _, i := range ifs {
		if i.ID != m.BootInterface.ID && i.Type == "physical" {
			iface = i.ID
			break
		}
	}
	if iface < 0 {
		return permanent{fmt.Errorf("phase-2 RoCE: machine %s has no physical interface besides its boot interface", w.SystemID)}
	}
	return mc.LinkStatic(ctx, w.SystemID, iface, subnet, w.RoCEAddress)
}

// freeRoCEAddress is the lowest address of the site's pool that no
// workflow of the site holds (the FSM re-checks on apply).
func (r *Runner) freeRoCEAddress(site *proto.Site) (string, error) {
	held := map[string]bool{}
	for _, o := range r.cfg.Ledger.Store().Snapshot().MAASWorkflows() {
		if o.Site == site.Name && o.RoCEAddress != "" {
			held[o.RoCEAddress] = true
		}
	}
	a, err := netip.ParseAddr(site.RoCEPool.First)
	if err != nil {
		return "", permanent{fmt.Errorf("roce_pool first: %w", err)}
	}
	last, err := netip.ParseAddr(site.RoCEPool.Last)
	if err != nil {
		return "", permanent{fmt.Errorf("roce_pool last: %w", err)}
	}
	for ; !last.Less(a); a = a.Next() {
		if !held[a.String()] {
			return a.String(), nil
		}
	}
	return "", permanent{fmt.Errorf("phase-2 RoCE: site %s roce_pool %s-%s is exhausted", site.Name, site.RoCEPool.First, site.RoCEPool.Last)}
}

// hwSync is the require_hw_sync completion gate: the node is not done
// until MAAS reports a hardware sync of the deployed machine. A machine
// deployed without hardware sync, or whose sync never comes before the
// expiry, fails the workflow with that reason.
func (r *Runner) hwSync(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	if !p.RequireHWSync {
		addEvent(w, r.now(), "skipped", "require_hw_sync is off")
		return nil
	}
	expiry := r.cfg.HWSyncExpiry
	if expiry <= 0 {
		expiry = 2 * time.Duration(p.HardwareSyncInterval)
	}
	start := time.Now()
	for {
		m, err := mc.Machine(ctx, w.SystemID)
		if err != nil {
			return err
		}
		if !m.EnableHwSync {
			return permanent{fmt.Errorf("hardware sync gate: %s was deployed without hardware sync (require_hw_sync)", w.SystemID)}
		}
		if last := time.Time(m.HwLastSync); !last.IsZero() {
			addEvent(w, r.now(), "hw_sync", "MAAS last_sync "+last.UTC().Format(time.RFC3339))
			return nil
		}
		if time.Since(start) >= expiry {
			return permanent{fmt.Errorf("hardware sync gate: MAAS reported no hardware sync of %s within %s (stale or broken sync; require_hw_sync)", w.SystemID, expiry)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.cfg.HWSyncPoll):
		}
	}
}
