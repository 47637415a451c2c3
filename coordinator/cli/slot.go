package cli

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

func (a *app) slotCmd() *cobra.Command {
	c := &cobra.Command{Use: "slot", Aliases: []string{"slots"}, Short: "List, approve, disable, repair and clean up slots"}
	c.AddCommand(a.slotListCmd(), a.slotShowCmd(), a.slotApproveCmd(), a.slotDisableCmd(), a.slotRepairCmd(), a.slotCleanupCmd(), a.slotHistoryCmd())
	return c
}

func slotHeader(w *tabwriter.Writer) {
	row(w, "ID", "NODE", "INDEX", "STATUS", "HEALTH", "GPU", "NUMA", "SWITCH", "CLAIM", "GENERATION", "MISSING")
}

// slotLine is the list table of one slot.
func slotLine(w *tabwriter.Writer, s proto.Slot) {
	slotHeader(w)
	slotRow(w, s)
}

func slotRow(w *tabwriter.Writer, s proto.Slot) {
	health := s.HealthState
	if s.StatusReason != "" {
		health = strings.TrimSpace(health + " " + s.StatusReason)
	}
	if b := s.HardwareBlocker(); b != "" {
		health = strings.TrimSpace(health + " " + b)
	}
	row(w, s.ID, s.NodeID, s.Index, s.Status, health, s.Capacity.GPUPCIAddress, s.Capacity.NUMANode, s.Capacity.PCIeSwitch,
		s.ClaimID, s.Generation, strings.Join(s.Capacity.MissingBindings(), ","))
}

func (a *app) slotListCmd() *cobra.Command {
	return listCmd(a, "list", "List approved slots", "/v1/slots", plainPage, []filter{
		{"node", "only slots of this node"},
		{"status", "only slots in this status"},
	}, listTable(slotHeader, slotRow))
}

func (a *app) slotShowCmd() *cobra.Command {
	return idCmd(a, "show", "Show a slot", http.MethodGet, "/v1/slots/", "", slotDetail)
}

func slotDetail(w *tabwriter.Writer, s proto.Slot) {
	c := s.Capacity
	row(w, "ID:", s.ID)
	row(w, "Node/index:", s.NodeID+"/"+strconv.Itoa(s.Index))
	row(w, "Status:", s.Status)
	row(w, "Status reason:", s.StatusReason)
	row(w, "Health:", strings.TrimSpace(s.HealthState+" "+s.HealthDetail))
	if h := s.Hardware; h != nil {
		hw := h.Summary() + " (scanned " + ts(h.At) + ")"
		if s.HardwareBlocker() != "" {
			hw += "; not placed until a scan finds it ok"
		}
		row(w, "Hardware:", hw)
	}
	row(w, "Claim:", s.ClaimID)
	row(w, "Generation:", s.Generation)
	row(w, "Touched:", yesNo(s.Touched))
	row(w, "GPU:", c.GPUPCIAddress)
	row(w, "NUMA/switch:", strconv.Itoa(c.NUMANode)+"/"+c.PCIeSwitch)
	row(w, "NVMe:", strings.TrimSpace(c.NVMe.Serial+" "+c.NVMe.WWN+" "+c.NVMe.EUI+" "+c.NVMe.Model))
	row(w, "Management MAC/IP:", c.ManagementMAC+" "+c.PrivateIP)
	row(w, "Fabric:", c.FabricClaimMode+" "+c.FabricVFPCIAddress)
	row(w, "OVS port:", c.OVSPort)
	row(w, "Missing bindings:", strings.Join(c.MissingBindings(), ", "))
	if p := s.WipeProof; p != nil {
		row(w, "Wipe proof:", p.Method+" "+ts(p.VerifiedAt)+" "+p.SampleDigest)
	}
}

func (a *app) slotApproveCmd() *cobra.Command {
	var o proto.SlotCapacityOverride
	var gpu, sw, mac, ip, mode, vf, ovs, serial string
	var numa int
	c := &cobra.Command{
		Use:   "approve NODE INDEX",
		Short: "Approve a discovered candidate into a slot, optionally overriding its capacity (admin)",
		Example: "  gpuaasctl slot approve j22u15 3\n" +
			"  gpuaasctl slot approve j22u15 3 --private-ip 10.77.0.14 --mac 52:54:00:22:15:03",
		Args: exactArgs("NODE", "INDEX"),
		RunE: func(cmd *cobra.Command, args []string) error {
			idx, err := strconv.Atoi(args[1])
			if err != nil || idx < 0 {
				return usagef("INDEX %q is not a non-negative integer", args[1])
			}
			f := cmd.Flags()
			set := func(flag string, dst **string, v string) {
				if f.Changed(flag) {
					*dst = &v
				}
			}
			set("gpu-pci", &o.GPUPCIAddress, gpu)
			set("pcie-switch", &o.PCIeSwitch, sw)
			set("mac", &o.ManagementMAC, mac)
			set("private-ip", &o.PrivateIP, ip)
			set("fabric-mode", &o.FabricClaimMode, mode)
			set("fabric-vf", &o.FabricVFPCIAddress, vf)
			set("ovs-port", &o.OVSPort, ovs)
			if f.Changed("numa") {
				o.NUMANode = &numa
			}
			if f.Changed("nvme-serial") {
				o.NVMe = &proto.DiskIdentity{Serial: serial}
			}
			body := proto.SlotApproveBody{Index: idx}
			if o != (proto.SlotCapacityOverride{}) {
				body.Capacity = &o
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/nodes/"+pathEscape(args[0])+"/slots", nil, body, nil)
			if err != nil {
				return err
			}
			return show(a, r, slotDetail)
		},
	}
	f := c.Flags()
	f.StringVar(&gpu, "gpu-pci", "", "override the GPU PCI address")
	f.IntVar(&numa, "numa", 0, "override the NUMA node")
	f.StringVar(&sw, "pcie-switch", "", "override the PCIe switch locality key")
	f.StringVar(&serial, "nvme-serial", "", "override the NVMe identity with this serial")
	f.StringVar(&mac, "mac", "", "override the management MAC")
	f.StringVar(&ip, "private-ip", "", "override the private IP")
	f.StringVar(&mode, "fabric-mode", "", "override the fabric claim mode")
	f.StringVar(&vf, "fabric-vf", "", "override the fabric VF PCI address")
	f.StringVar(&ovs, "ovs-port", "", "override the OVS port")
	return c
}

func (a *app) slotDisableCmd() *cobra.Command {
	var reason string
	c := &cobra.Command{
		Use:   "disable ID",
		Short: "Take a free slot out of service (admin)",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var body any
			if reason != "" {
				body = proto.SlotDisableBody{Reason: reason}
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/slots/"+pathEscape(args[0])+"/disable", nil, body, nil)
			if err != nil {
				return err
			}
			return show(a, r, slotLine)
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why")
	return c
}

func (a *app) slotRepairCmd() *cobra.Command {
	return idCmd(a, "repair", "Bring a disabled or quarantined slot back once complete, valid and clean (admin); a quarantined one a claim held goes cleanup_blocked first", http.MethodPost, "/v1/slots/", "/repair", slotLine)
}

func (a *app) topologyCmd() *cobra.Command {
	c := &cobra.Command{Use: "topology", Short: "Show discovered candidate topology"}
	c.AddCommand(&cobra.Command{
		Use:   "show NODE",
		Short: "Show a node's latest discovered candidates (never schedulable until approved)",
		Args:  exactArgs("NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodGet, "/v1/nodes/"+pathEscape(args[0])+"/topology", nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, t proto.CandidateTopology) {
				row(w, "INDEX", "GPU", "NUMA", "SWITCH", "NVME", "MAC", "IP", "FABRIC-VF", "PROBLEMS")
				for _, c := range t.Candidates {
					probs := append([]string(nil), c.Problems...)
					if c.DiskMounted {
						probs = append(probs, "disk mounted")
					}
					probs = append(probs, c.DiskSignatures...)
					probs = append(probs, c.Capacity.MissingBindings()...)
					row(w, c.Index, c.Capacity.GPUPCIAddress, c.Capacity.NUMANode, c.Capacity.PCIeSwitch, c.Capacity.NVMe.Serial,
						c.Capacity.ManagementMAC, c.Capacity.PrivateIP, c.Capacity.FabricVFPCIAddress, strings.Join(probs, "; "))
				}
				for _, b := range t.Blockers {
					row(w, "blocker:", b)
				}
				for _, d := range t.ConvertibleDisks {
					row(w, "convertible:", convertibleLine(d))
				}
			})
		},
	})
	return c
}

func (a *app) slotCleanupCmd() *cobra.Command {
	var key string
	var wait bool
	var waitLimit time.Duration
	c := &cobra.Command{
		Use:   "cleanup ID",
		Short: "Queue a wipe of a cleanup_blocked slot by its node's agent (admin); its proof makes the slot available",
		Long: "Queue a slot.cleanup task for a cleanup_blocked slot. While one is open it is shown instead\n" +
			"of a second; --idempotency-key makes a retry return the task it created. With --wait the\n" +
			"command follows the wipe and shows the slot at the end (exit 1 when the cleanup failed).",
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			hdr := http.Header{}
			if key != "" {
				if err := proto.ValidateIdempotencyKey(key); err != nil {
					return usageError{err}
				}
				hdr.Set(proto.IdempotencyKeyHeader, key)
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/slots/"+pathEscape(args[0])+"/cleanup", nil, nil, hdr)
			if err != nil {
				return err
			}
			if r.Status == http.StatusOK {
				fmt.Fprintln(a.errOut, "a cleanup of this slot was requested before: this is its task")
			}
			if !wait {
				return show(a, r, taskDetail)
			}
			t, err := decode[proto.Task](r)
			if err != nil {
				return err
			}
			if t, err = a.followTask(cmd, t, proto.StageWipe, waitLimit); err != nil {
				return err
			}
			if t.State != proto.TaskSucceeded {
				return fmt.Errorf("cleanup task %s of slot %s %s: %s", t.ID, args[0], t.State, t.Error)
			}
			if r, err = a.settledSlot(cmd, t.NodeID, args[0]); err != nil {
				return err
			}
			return show(a, r, slotDetail)
		},
	}
	f := c.Flags()
	f.StringVar(&key, "idempotency-key", "", "idempotency key: a retry with it returns the task it created")
	f.BoolVar(&wait, "wait", false, "follow the cleanup until the slot has its proof")
	f.DurationVar(&waitLimit, "wait-timeout", 30*time.Minute, "how long --wait follows before giving up")
	return c
}

func taskDetail(w *tabwriter.Writer, t proto.Task) {
	row(w, "ID:", t.ID)
	row(w, "Type:", t.Type)
	row(w, "Node:", t.NodeID)
	row(w, "Allocation:", t.AllocationID)
	row(w, "State:", t.State)
	if t.Stage != "" || t.Total > 0 {
		row(w, "Stage:", strings.TrimSpace(t.Stage+" "+progressText(t.Done, t.Total)))
	}
	row(w, "Error:", t.Error)
	row(w, "Created:", ts(t.CreatedAt))
	row(w, "Updated:", ts(t.UpdatedAt))
}

// progressText is "done / total (pct)" or "" without a total.
func progressText(done, total int64) string {
	if total <= 0 {
		return ""
	}
	return fmt.Sprintf("%s / %s (%.0f%%)", fmtBytes(float64(done)), fmtBytes(float64(total)), 100*float64(done)/float64(total))
}
