package cli

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

func (a *app) nodeCmd() *cobra.Command {
	c := &cobra.Command{Use: "node", Aliases: []string{"nodes"}, Short: "List, show, drain and re-purpose nodes"}
	c.AddCommand(a.nodeListCmd(), a.nodeShowCmd(), a.nodeDrainCmd("drain", true), a.nodeDrainCmd("undrain", false), a.nodeResetBreakerCmd(), a.nodeIntentCmd(), a.nodeTasksCmd(), a.nodePrepareSliceCmd(), a.nodeDiskApproveCmd())
	return c
}

// SliceReady is the SLICE-READY column (gpuaas-lab status shows it too).
// Readiness is what the agent last reported: on a node that is not active
// (unreachable, disabled, not yet enrolled) it is stale, so such a node
// is shown not ready, with its state. A baremetal node is sold whole and
// never carries slices: "-".
func SliceReady(n proto.Node) string {
	switch {
	case n.ProfileIntent == proto.IntentBaremetal:
		return "- (baremetal)"
	case n.State != proto.NodeActive:
		return fmt.Sprintf("no (%s)", n.State)
	case n.Readiness == nil:
		return "unknown"
	case n.Readiness.SliceReady:
		return "yes"
	case len(n.Readiness.Blockers) == 1:
		return "no (1 blocker)"
	}
	return fmt.Sprintf("no (%d blockers)", len(n.Readiness.Blockers))
}

func nodeRow(w *tabwriter.Writer, n proto.Node) {
	row(w, n.ID, n.Region, n.Pool, n.ProfileIntent, n.State, gpus(n), yesNo(n.Draining), SliceReady(n))
}

func nodeHeader(w *tabwriter.Writer) {
	row(w, "ID", "REGION", "POOL", "INTENT", "STATE", "GPUS", "DRAINING", "SLICE-READY")
}

// nodeLine is the list table of one node.
func nodeLine(w *tabwriter.Writer, n proto.Node) {
	nodeHeader(w)
	nodeRow(w, n)
}

// gpus is a node's discovered GPU count ("-" before discovery).
func gpus(n proto.Node) string {
	if n.GPUs == 0 {
		return "-"
	}
	return strconv.Itoa(n.GPUs)
}

func (a *app) nodeListCmd() *cobra.Command {
	return listCmd(a, "list", "List nodes", "/v1/nodes", plainPage, []filter{
		{"region", "only nodes of this region"},
		{"pool", "only nodes of this pool"},
		{"state", "only nodes in this state"},
		{"intent", "only nodes with this profile intent (slice_vm, baremetal)"},
	}, listTable(nodeHeader, nodeRow))
}

func nodeDetail(w *tabwriter.Writer, d proto.NodeDetail) {
	n := d.Node
	row(w, "ID:", n.ID)
	row(w, "Hostname:", n.Hostname)
	row(w, "Region/pool:", n.Region+"/"+n.Pool)
	row(w, "Intent:", n.ProfileIntent)
	row(w, "State:", n.State)
	row(w, "GPUs:", gpus(n))
	row(w, "Draining:", yesNo(n.Draining))
	if b := n.Breaker; b != nil {
		switch {
		case b.Open:
			row(w, "Circuit breaker:", "open, out of placement until "+ts(b.Until)+" or `gpuaasctl node reset-breaker "+n.ID+"`: "+b.Reason)
		case b.Probation:
			row(w, "Circuit breaker:", "closed after its cool-down, on probation: one more failure reopens it")
		case len(b.Failures) > 0:
			row(w, "Circuit breaker:", fmt.Sprintf("closed, %d recent failures (opens at %d within %v)", len(b.Failures), proto.BreakerThreshold, proto.BreakerWindow))
		}
	}
	s := d.SlotSummary
	var counts []string
	for _, st := range proto.SlotStatuses {
		if s.ByStatus[st] > 0 {
			counts = append(counts, fmt.Sprintf("%s %d", st, s.ByStatus[st]))
		}
	}
	row(w, "Slots:", fmt.Sprintf("%d (%s)", s.Total, strings.Join(counts, ", ")))
	row(w, "Incomplete slots:", s.Incomplete)
	held := fmt.Sprintf("%d slot claims", s.LiveSlotClaims)
	if s.NodeExclusive {
		held = "node_exclusive (baremetal)"
	}
	row(w, "Held by:", held)
	for _, dr := range d.Drift {
		row(w, "Drift "+dr.SlotID+":", dr.Detail)
	}
	for _, q := range d.Quarantined {
		row(w, "Quarantined "+q.SlotID+":", q.Reason)
	}
	for _, h := range d.SlotHardware {
		row(w, "Out of placement "+h.SlotID+":", "hardware "+h.Summary()+" (since "+ts(h.At)+")")
	}
	if n.Readiness == nil {
		row(w, "Readiness:", "no evidence reported")
		return
	}
	rd := n.Readiness
	row(w, "Active:", yesNo(rd.Active))
	ready := yesNo(rd.SliceReady)
	switch {
	case n.ProfileIntent == proto.IntentBaremetal:
		ready = "- (baremetal: the node is sold whole, never as slices)"
	case n.State != proto.NodeActive && rd.SliceReady:
		ready = fmt.Sprintf("no (node is %s; the agent's last report said yes)", n.State)
	}
	row(w, "Slice-ready:", ready)
	row(w, "Observed:", ts(rd.ObservedAt))
	for _, b := range rd.Blockers {
		row(w, "Blocker:", b)
	}
	for _, e := range rd.Evidence {
		mark := "ok"
		if !e.OK {
			mark = "FAIL"
		}
		row(w, "Check "+e.Check+":", strings.TrimSpace(mark+" "+e.Detail))
	}
}

func (a *app) nodeShowCmd() *cobra.Command {
	return idCmd(a, "show", "Show a node with its readiness evidence and slot summary", http.MethodGet, "/v1/nodes/", "", nodeDetail)
}

func (a *app) nodeDrainCmd(verb string, drain bool) *cobra.Command {
	short := "Stop new claims on a node; existing ones run to release (admin)"
	if !drain {
		short = "Let a drained node take new claims again (admin)"
	}
	return idCmd(a, verb, short, http.MethodPost, "/v1/nodes/", "/"+verb, nodeLine)
}

func (a *app) nodeResetBreakerCmd() *cobra.Command {
	return idCmd(a, "reset-breaker", "Close a node's circuit breaker so it takes placements again (admin)", http.MethodPost, "/v1/nodes/", "/breaker/reset", nodeLine)
}

func (a *app) nodeIntentCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "intent ID slice_vm|baremetal",
		Short: "Set what a node sells (admin)",
		Args:  exactArgs("ID", "INTENT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			intent := proto.ProfileIntent(args[1])
			if !intent.Valid() {
				return usagef("intent %q: use slice_vm or baremetal", args[1])
			}
			r, err := a.call(cmd, http.MethodPut, "/v1/nodes/"+pathEscape(args[0])+"/intent", nil, proto.NodeIntentBody{Intent: intent}, nil)
			if err != nil {
				return err
			}
			return show(a, r, nodeLine)
		},
	}
}

func (a *app) nodeTasksCmd() *cobra.Command {
	return pagedIDCmd(a, "tasks", "List the tasks queued for a node's agent", "/v1/nodes/", "/tasks", taskPage, taskTable)
}

// taskPage is the usage of the page flags of the task lists.
var taskPage = pageUsage{after: "page cursor: start after this task ID", limit: "page size"}

func taskTable(w *tabwriter.Writer, l proto.List[proto.Task]) {
	row(w, "ID", "NODE", "ALLOCATION", "TYPE", "STATE", "UPDATED", "STAGE", "PROGRESS", "ERROR")
	for _, t := range l.Items {
		progress := t.Progress
		if p := progressText(t.Done, t.Total); p != "" {
			progress = strings.TrimSpace(p + " " + progress)
		}
		row(w, t.ID, t.NodeID, t.AllocationID, t.Type, t.State, ts(t.UpdatedAt), t.Stage, progress, t.Error)
	}
}

// tasksCmd is the top-level "tasks --node N | --alloc A".
func (a *app) tasksCmd() *cobra.Command {
	var node, alloc string
	var page func(map[string]string) map[string]string
	c := &cobra.Command{
		Use:   "tasks",
		Short: "List node tasks of a node (--node) or an allocation (--alloc)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case node != "" && alloc == "":
				return listPage(a, cmd, "/v1/nodes/"+pathEscape(node)+"/tasks", page(nil), taskTable)
			case alloc != "" && node == "":
				return listPage(a, cmd, "/v1/allocations/"+pathEscape(alloc)+"/tasks", page(nil), taskTable)
			}
			return usagef("give exactly one of --node or --alloc")
		},
	}
	page = pageFlags(c, taskPage)
	f := c.Flags()
	f.StringVar(&node, "node", "", "node ID")
	f.StringVar(&alloc, "alloc", "", "allocation ID")
	return c
}
