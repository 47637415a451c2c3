package cli

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

func (a *app) allocCmd() *cobra.Command {
	c := &cobra.Command{Use: "alloc", Aliases: []string{"allocation", "allocations"}, Short: "Create, list, show and release allocations"}
	c.AddCommand(a.allocCreateCmd(), a.allocListCmd(), a.allocShowCmd(), a.allocReleaseCmd(), a.allocForceReleaseCmd(),
		a.allocTimelineCmd(), a.allocClaimsCmd(), a.allocTasksCmd(), a.allocSSHCmd(), a.allocConsoleCmd(),
		a.allocConsoleSessionsCmd(), a.allocConsoleTranscriptCmd(), a.allocIngressCmd())
	return c
}

func newIdempotencyKey() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate idempotency key: %w", err)
	}
	return "gpuaasctl-" + hex.EncodeToString(b[:]), nil
}

// createIdempotent POSTs body to path under an idempotency key (key ""
// generates one and prints it on stderr; a bad one is a usage error).
// An answer 200 means the key was used before: it says so on stderr,
// naming what the first request made (reused, e.g. "the allocation it
// created").
func (a *app) createIdempotent(cmd *cobra.Command, path string, body any, key, reused string) (*Response, error) {
	if key == "" {
		var err error
		if key, err = newIdempotencyKey(); err != nil {
			return nil, err
		}
		fmt.Fprintf(a.errOut, "idempotency key: %s\n", key)
	} else if err := proto.ValidateIdempotencyKey(key); err != nil {
		return nil, usageError{err}
	}
	hdr := http.Header{}
	hdr.Set(proto.IdempotencyKeyHeader, key)
	r, err := a.call(cmd, http.MethodPost, path, nil, body, hdr)
	if err != nil {
		return nil, err
	}
	if r.Status == http.StatusOK {
		fmt.Fprintf(a.errOut, "idempotency key %s was used before: this is %s\n", key, reused)
	}
	return r, nil
}

func (a *app) allocCreateCmd() *cobra.Command {
	var req proto.AllocationCreateRequest
	var shape, key string
	var wait bool
	var waitLimit time.Duration
	c := &cobra.Command{
		Use:   "create",
		Short: "Place an allocation (gpu_slice by default); prints the allocation",
		Long: "Place an allocation. The idempotency key makes retries safe: the same key returns the\n" +
			"same allocation. Without --idempotency-key one is generated and printed on stderr;\n" +
			"re-run with it to retry. With --wait the command follows the allocation live: one line\n" +
			"per stage, a progress bar during the clone, and at the end the SSH command of the slice;\n" +
			"a failure prints the stage and reason and exits 1.",
		Example: "  gpuaasctl alloc create --gpus 2 --region us-east\n  gpuaasctl alloc create --gpus 1 --region us-east --ssh-key \"$(cat ~/.ssh/id_ed25519.pub)\" --wait\n" +
			"  gpuaasctl alloc create --shape baremetal --region us-east --idempotency-key order-17",
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req.CapacityShape = proto.CapacityShape(shape)
			if !req.CapacityShape.Valid() {
				return usagef("--shape %q: use gpu_slice or baremetal", shape)
			}
			if req.SKU == "" {
				req.SKU = "h200-sxm-slice"
				if req.CapacityShape == proto.ShapeBaremetal {
					req.SKU = "h200-sxm-baremetal"
				}
			}
			if req.Region == "" {
				return usagef("--region is required")
			}
			if _, err := proto.ParseIngressRules(req.Ingress); err != nil {
				return usageError{fmt.Errorf("--ingress: %w", err)}
			}
			r, err := a.createIdempotent(cmd, "/v1/allocations", req, key, "the allocation it created")
			if err != nil {
				return err
			}
			if !wait {
				return show(a, r, allocDetail)
			}
			al, err := decode[proto.Allocation](r)
			if err != nil {
				return err
			}
			if a.output != "json" {
				fmt.Fprintf(a.out, "allocation %s placed on node %s; following it (Ctrl-C stops following, not the allocation)\n", al.ID, al.NodeID)
			}
			return a.followAllocation(cmd, al.ID, waitLimit)
		},
	}
	f := c.Flags()
	f.StringVar(&shape, "shape", string(proto.ShapeGPUSlice), "capacity shape: gpu_slice or baremetal")
	f.StringVar(&req.SKU, "sku", "", "SKU (default h200-sxm-slice, or h200-sxm-baremetal with --shape baremetal)")
	f.IntVar(&req.GPUCount, "gpus", 0, "GPU count of a slice: 1, 2, 4 or 8")
	f.StringVar(&req.Region, "region", "", "region (required)")
	f.StringVar(&req.Image, "image", "", "approved catalog image: NAME (newest approved version) or NAME:VERSION (slices default to the slice_base image approved last)")
	f.StringArrayVar(&req.SSHPublicKeys, "ssh-key", nil, "OpenSSH public key (repeatable)")
	f.StringVar(&req.Owner, "owner", "", "owner (default: the token's name)")
	f.StringArrayVar(&req.Ingress, "ingress", nil, "public ingress rule to open with the slice, PROTOCOL/PORT e.g. tcp/22 (repeatable; the site must declare public addressing)")
	f.StringVar(&key, "idempotency-key", "", "idempotency key (generated and printed when absent)")
	f.BoolVar(&wait, "wait", false, "follow the allocation until it is active (prints the SSH command) or failed (exit 1)")
	f.DurationVar(&waitLimit, "wait-timeout", 15*time.Minute, "how long --wait follows before giving up")
	return c
}

func allocTable(w *tabwriter.Writer, l proto.List[proto.Allocation]) {
	row(w, "ID", "SHAPE", "SKU", "GPUS", "REGION", "NODE", "STATE", "OWNER", "CREATED")
	for _, x := range l.Items {
		row(w, x.ID, x.Shape, x.SKU, x.GPUCount, x.Region, x.NodeID, x.State, x.Owner, ts(x.CreatedAt))
	}
}

func allocDetail(w *tabwriter.Writer, x proto.Allocation) {
	row(w, "ID:", x.ID)
	row(w, "State:", x.State)
	if x.Reason != "" {
		row(w, "Reason:", x.Reason)
	}
	row(w, "Shape:", x.Shape)
	row(w, "SKU:", x.SKU)
	row(w, "GPUs:", x.GPUCount)
	row(w, "Region:", x.Region)
	row(w, "Node:", x.NodeID)
	row(w, "Claims:", strings.Join(x.ClaimIDs, ", "))
	row(w, "Owner:", x.Owner)
	row(w, "Image:", x.Image)
	row(w, "Idempotency key:", x.IdempotencyKey)
	row(w, "Created:", ts(x.CreatedAt))
	row(w, "Activated:", tsp(x.ActivatedAt))
	row(w, "Ended:", tsp(x.EndedAt))
	if x.Access != nil {
		// What alloc ssh --print and alloc create --wait give.
		row(w, "SSH:", sshCommand(x.Access))
		if note := noKeyNote(x); note != "" {
			row(w, "SSH keys:", note)
		}
	}
	for _, r := range x.Ingress {
		row(w, "Ingress:", fmt.Sprintf("%s -> %s (%s)", r.Public(), r.Rule(), r.State))
	}
	row(w, "Index:", fmt.Sprintf("create %d, modify %d", x.CreateIndex, x.ModifyIndex))
}

func (a *app) allocListCmd() *cobra.Command {
	return listCmd(a, "list", "List allocations (a tenant token lists its own only)", "/v1/allocations",
		pageUsage{after: "page cursor: start after this allocation ID", limit: limitUsage}, []filter{
			{"state", "only allocations in this state"},
			{"node", "only allocations on this node"},
			{"region", "only allocations in this region"},
			{"owner", "only allocations of this owner"},
		}, allocTable)
}

func (a *app) allocShowCmd() *cobra.Command {
	return idCmd(a, "show", "Show an allocation", http.MethodGet, "/v1/allocations/", "", allocDetail)
}

func (a *app) allocReleaseCmd() *cobra.Command {
	var wait bool
	var waitLimit time.Duration
	c := &cobra.Command{
		Use:   "release ID",
		Short: "Start a graceful release (a slice: the agent wipes the disks; bare metal: MAAS release with erase), then the capacity is free",
		Long: "Start a graceful release. With --wait the command follows it live, one line per stage,\n" +
			"until the allocation is released; a slot whose wipe failed is named (cleanup_blocked).",
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodPost, "/v1/allocations/"+pathEscape(args[0])+"/release", nil, nil, nil)
			if err != nil {
				return err
			}
			forgetKnownHosts(args[0])
			if !wait {
				return show(a, r, allocDetail)
			}
			return a.followRelease(cmd, args[0], waitLimit)
		},
	}
	c.Flags().BoolVar(&wait, "wait", false, "follow the release until the allocation is released")
	c.Flags().DurationVar(&waitLimit, "wait-timeout", 15*time.Minute, "how long --wait follows before giving up")
	return c
}

func (a *app) allocForceReleaseCmd() *cobra.Command {
	var reason string
	c := &cobra.Command{
		Use:   "force-release ID",
		Short: "Free an allocation at once without the agent (admin); touched slots go cleanup_blocked",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var body any
			if reason != "" {
				body = proto.AllocationForceReleaseBody{Reason: reason}
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/allocations/"+pathEscape(args[0])+"/force-release", nil, body, nil)
			if err != nil {
				return err
			}
			forgetKnownHosts(args[0])
			return show(a, r, allocDetail)
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why (recorded on the allocation)")
	return c
}

func (a *app) allocTimelineCmd() *cobra.Command {
	return pagedIDCmd(a, "timeline", "Show an allocation's timeline with each stage's duration (its end minus its start)", "/v1/allocations/", "/timeline", cursorPage("sequence number"), func(w *tabwriter.Writer, l proto.List[proto.TimelineEvent]) {
		row(w, "SEQ", "AT", "STAGE", "STATUS", "DURATION", "MESSAGE")
		for _, cells := range timelineRows(l.Items) {
			row(w, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5])
		}
	})
}

func (a *app) allocClaimsCmd() *cobra.Command {
	return pagedIDCmd(a, "claims", "Show an allocation's resource claims", "/v1/allocations/", "/claims", cursorPage("claim ID"), func(w *tabwriter.Writer, l proto.List[proto.Claim]) {
		row(w, "ID", "KIND", "NODE", "SLOT", "GENERATION", "LIVE", "ENDED")
		for _, c := range l.Items {
			row(w, c.ID, c.Kind, c.NodeID, c.SlotID, c.Generation, yesNo(c.Live), tsp(c.EndedAt))
		}
	})
}

func (a *app) allocTasksCmd() *cobra.Command {
	return pagedIDCmd(a, "tasks", "List an allocation's node tasks", "/v1/allocations/", "/tasks", taskPage, taskTable)
}
