package maasflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/canonical/gomaasclient/entity/node"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/proto"
)

// Decommission: release (erasing; without erase when MAAS cannot wipe and
// release_fallback_no_erase allows it) → power off (full_decommission) →
// deploy again (reimage) → detach the ledger node (all but reimage).
// detach_only and customer_handoff never call MAAS: no client is built,
// no credential is opened.

func touchesMAAS(m proto.ReleaseMode) bool {
	return m == proto.ReleaseFullDecommission || m == proto.ReleaseReimage
}

func (r *Runner) decommissionStage(ctx context.Context, w *proto.MAASWorkflow, site *proto.Site, p *proto.SiteProfile) (proto.WorkflowStage, error) {
	mode := w.ReleaseMode
	client := func() (*maas.Client, error) {
		mc, err := r.cfg.MAAS(ctx, site)
		if err != nil {
			return nil, fmt.Errorf("workflow %s: maas client for site %s: %w", w.ID, site.Name, err)
		}
		if w.SystemID == "" {
			m, err := mc.Resolve(ctx, maas.Query{Hostname: w.Hostname})
			if err != nil {
				return nil, err
			}
			w.SystemID = m.SystemID
		}
		return mc, nil
	}
	switch w.Stage {
	case proto.StageRelease:
		if !touchesMAAS(mode) {
			addEvent(w, r.now(), "skipped", "release mode "+string(mode)+" does not call MAAS")
			return proto.StagePowerOff, nil
		}
		mc, err := client()
		if err != nil {
			return "", err
		}
		defer r.copyMAASEvents(ctx, mc, w)
		return proto.StagePowerOff, r.release(ctx, mc, w, p, "gpuaas decommission")
	case proto.StagePowerOff:
		if mode != proto.ReleaseFullDecommission {
			return proto.StageDeploy, nil
		}
		mc, err := client()
		if err != nil {
			return "", err
		}
		return proto.StageDeploy, mc.PowerOff(ctx, w.SystemID)
	case proto.StageDeploy:
		if mode != proto.ReleaseReimage {
			return proto.StageDetach, nil
		}
		mc, err := client()
		if err != nil {
			return "", err
		}
		return proto.StageDetach, r.deploy(ctx, mc, w, site, p)
	case proto.StageDetach:
		if mode == proto.ReleaseReimage {
			return proto.StageDone, nil
		}
		return proto.StageDone, r.detach(ctx, w, mode)
	}
	return "", permanent{fmt.Errorf("workflow %s: no decommission stage %q", w.ID, w.Stage)}
}

// release releases to Ready with erase. An erase MAAS cannot perform
// (Failed disk erasing) is followed by a release without erase only when
// the profile's release_fallback_no_erase allows it.
func (r *Runner) release(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, p *proto.SiteProfile, comment string) error {
	m, err := mc.Machine(ctx, w.SystemID)
	if err != nil {
		return err
	}
	if m.Status != node.StatusFailedDiskErasing {
		_, err = mc.Release(ctx, w.SystemID, maas.ReleaseParams{Erase: true, SecureErase: true, QuickErase: true,
			Comment: comment}, r.wait(w, r.cfg.ReleaseExpiry))
		var fe *maas.FailedError
		if !errors.As(err, &fe) || fe.Status != node.StatusFailedDiskErasing {
			return err
		}
		m = &maas.Machine{ErrorDescription: fe.ErrorDescription}
	}
	if !p.ReleaseFallbackNoErase {
		return permanent{fmt.Errorf("release of %s: MAAS could not erase the disks (%s) and release_fallback_no_erase is off", w.SystemID, m.ErrorDescription)}
	}
	addEvent(w, r.now(), "erase_fallback", fmt.Sprintf("MAAS could not erase (%s): releasing without erase (release_fallback_no_erase)", m.ErrorDescription))
	_, err = mc.Release(ctx, w.SystemID, maas.ReleaseParams{Comment: comment + ": no erase (fallback)"}, r.wait(w, r.cfg.ReleaseExpiry))
	return err
}

// detach disables the ledger node: GPUaaS stops using it, and the
// node's agent client certificates are revoked (the replicated
// revocation list).
func (r *Runner) detach(ctx context.Context, w *proto.MAASWorkflow, mode proto.ReleaseMode) error {
	if _, ok := r.cfg.Ledger.Store().Snapshot().Node(w.Hostname); !ok {
		return nil
	}
	_, _, err := r.cfg.Ledger.Apply(ctx, proto.NodeSetStateType, proto.NodeSetStateRequest{At: r.now(), NodeID: w.Hostname,
		State: proto.NodeDisabled, Reason: "decommissioned (" + string(mode) + ")"})
	if err != nil && proto.CodeOf(err) != proto.CodeUnavailable && proto.CodeOf(err) != proto.CodeInternal {
		return permanent{fmt.Errorf("detach node %s: %w", w.Hostname, err)}
	}
	if err != nil {
		return err
	}
	_, _, err = r.cfg.Ledger.Apply(ctx, proto.NodeCertRevokeType|proto.IgnoreUnknownTypeFlag, proto.NodeCertRevokeRequest{At: r.now(),
		NodeID: w.Hostname, Reason: "decommissioned (" + string(mode) + ")"})
	if c := proto.CodeOf(err); err != nil && (c == proto.CodeUnavailable || c == proto.CodeInternal) {
		return err
	}
	return nil
}
