package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

// nodePrepareSliceCmd is "node prepare-slice ID": queue host.prepare_slice
// and, with --wait, follow it to its result.
func (a *app) nodePrepareSliceCmd() *cobra.Command {
	var p proto.HostPrepareSlicePayload
	var wait time.Duration
	c := &cobra.Command{
		Use:   "prepare-slice ID",
		Short: "Make a node slice-ready: queue host.prepare_slice for its agent (admin)",
		Long: "Queues host.prepare_slice. The agent creates the fabric VFs, binds GPUs and VFs to vfio-pci\n" +
			"persistently, applies the IPoIB netplan/address/route, sets up ovsbr0 with the guest gateway\n" +
			"and isolation flows, the guest NAT, dnsmasq, the gpuaas-slice-* units and libvirtd, changing\n" +
			"only what differs, and reports the changes and the readiness it observed. Blank flags take\n" +
			"the agent's configured values.",
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			r, err := a.call(cmd, http.MethodPost, "/v1/nodes/"+pathEscape(node)+"/prepare-slice", nil, p, nil)
			if err != nil {
				return err
			}
			if wait <= 0 {
				return show(a, r, func(w *tabwriter.Writer, t proto.Task) {
					row(w, "TASK", "NODE", "TYPE", "STATE")
					row(w, t.ID, t.NodeID, t.Type, t.State)
				})
			}
			var t proto.Task
			if err := json.Unmarshal(r.Body, &t); err != nil {
				return fmt.Errorf("decode task: %w", err)
			}
			return a.waitPrepare(cmd, node, t.ID, wait)
		},
	}
	f := c.Flags()
	f.StringVar(&p.GuestSubnet, "guest-subnet", "", "guest network CIDR, e.g. 10.200.0.0/24")
	f.StringVar(&p.GuestGateway, "guest-gateway", "", "ovsbr0 gateway inside the guest subnet")
	f.StringVar(&p.FabricInterface, "fabric-interface", "", "IPoIB interface, e.g. ibp26s0")
	f.StringVar(&p.FabricAddress, "fabric-address", "", "IPoIB address with prefix, e.g. 172.16.22.11/16")
	f.StringVar(&p.FabricRoute, "fabric-route", "", "fabric route destination, e.g. 172.16.0.0/12")
	f.StringVar(&p.FabricGateway, "fabric-gateway", "", "fabric route next hop")
	f.IntVar(&p.VFsPerPF, "vfs-per-pf", 0, "fabric VFs per PF (0 = one per GPU)")
	f.StringSliceVar(&p.FabricPFs, "fabric-pf", nil, "PCI address of a fabric SR-IOV PF (repeatable)")
	f.StringVar(&p.Uplink, "uplink", "", "interface guests are NATed out of")
	f.DurationVar(&wait, "wait", 0, "follow the task until it finishes, at most this long (e.g. 2m)")
	return c
}

// waitPrepare polls the node's tasks until id finishes and prints its
// changes and readiness.
func (a *app) waitPrepare(cmd *cobra.Command, node, id string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		t, err := a.findTask(cmd, node, id)
		if err != nil {
			return err
		}
		if t != nil && (t.State == proto.TaskSucceeded || t.State == proto.TaskFailed || t.State == proto.TaskCancelled) {
			return a.printPrepare(cmd, *t)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("task %s not finished after %s", id, limit)
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (a *app) findTask(cmd *cobra.Command, node, id string) (*proto.Task, error) {
	after := ""
	for {
		r, err := a.call(cmd, http.MethodGet, "/v1/nodes/"+pathEscape(node)+"/tasks", map[string]string{"after": after}, nil, nil)
		if err != nil {
			return nil, err
		}
		var l proto.List[proto.Task]
		if err := json.Unmarshal(r.Body, &l); err != nil {
			return nil, fmt.Errorf("decode tasks: %w", err)
		}
		for i := range l.Items {
			if l.Items[i].ID == id {
				return &l.Items[i], nil
			}
		}
		if l.Next == "" {
			return nil, nil
		}
		after = l.Next
	}
}

func (a *app) printPrepare(cmd *cobra.Command, t proto.Task) error {
	out := cmd.OutOrStdout()
	if a.output == "json" {
		b, err := json.MarshalIndent(t, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(out, string(b))
	} else {
		var res proto.HostPrepareSliceResult
		if len(t.Result) > 0 {
			if err := json.Unmarshal(t.Result, &res); err != nil {
				return fmt.Errorf("decode result of %s: %w", t.ID, err)
			}
		}
		fmt.Fprintf(out, "task %s %s\n", t.ID, t.State)
		if len(res.Changed) == 0 && t.State == proto.TaskSucceeded {
			fmt.Fprintln(out, "no changes: the host was already converged")
		}
		for _, c := range res.Changed {
			fmt.Fprintln(out, "  changed: "+c)
		}
		fmt.Fprintf(out, "slice-ready: %t\n", res.SliceReady)
		for _, b := range res.Blockers {
			fmt.Fprintln(out, "  blocker: "+b)
		}
	}
	if t.State != proto.TaskSucceeded {
		return fmt.Errorf("host.prepare_slice on %s %s: %s", t.NodeID, t.State, t.Error)
	}
	return nil
}

// nodeDiskApproveCmd is "node disk-approve ID": record destructive slice
// ownership of a convertible disk.
func (a *app) nodeDiskApproveCmd() *cobra.Command {
	var b proto.DiskOwnershipBody
	c := &cobra.Command{
		Use:   "disk-approve ID",
		Short: "Approve destructive slice ownership of a disk that carried a host share mount (admin)",
		Long: "Convertible storage: a disk discovery saw with a host share mount stays out of slots until this\n" +
			"approval is recorded, infra has unmounted it and discovery is re-run; its slot then starts\n" +
			"cleanup_blocked and becomes available only with a wipe proof (slot cleanup).",
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if b.Serial == "" && b.WWN == "" && b.EUI == "" {
				return usagef("name the disk with --serial, --wwn or --eui")
			}
			if b.Reason == "" {
				return usagef("--reason is required (e.g. the infra ticket)")
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/nodes/"+pathEscape(args[0])+"/disks/ownership", nil, b, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, t proto.CandidateTopology) {
				row(w, "DISK", "MOUNTED", "MOUNTS", "APPROVER", "REASON")
				for _, d := range t.ConvertibleDisks {
					by, reason := "", ""
					if d.Approval != nil {
						by, reason = d.Approval.By, d.Approval.Reason
					}
					row(w, diskLabel(d.Disk), d.MountedNow, strings.Join(d.Mounts, "; "), by, reason)
				}
			})
		},
	}
	c.Flags().StringVar(&b.Serial, "serial", "", "disk serial number")
	c.Flags().StringVar(&b.WWN, "wwn", "", "disk WWN")
	c.Flags().StringVar(&b.EUI, "eui", "", "disk EUI-64")
	c.Flags().StringVar(&b.Reason, "reason", "", "why (e.g. the infra ticket that drained the share)")
	return c
}

func diskLabel(d proto.DiskIdentity) string {
	switch {
	case d.Serial != "":
		return "serial " + d.Serial
	case d.WWN != "":
		return "wwn " + d.WWN
	}
	return "eui " + d.EUI
}

// convertibleLine describes a convertible disk for topology show.
func convertibleLine(d proto.ConvertibleDisk) string {
	s := diskLabel(d.Disk) + " had host share mounts (" + strings.Join(d.Mounts, "; ") + ")"
	if d.MountedNow {
		s += ", still mounted"
	}
	if d.Approval == nil {
		return s + "; needs destructive ownership approval (gpuaasctl node disk-approve)"
	}
	return s + "; ownership approved by " + d.Approval.By + ": " + d.Approval.Reason
}
