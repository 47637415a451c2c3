package cli

import (
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

func (a *app) workflowCmd() *cobra.Command {
	c := &cobra.Command{Use: "workflow", Aliases: []string{"wf"}, Short: "MAAS workflows (onboarding, decommission) and their provisioning timeline"}
	list := listCmd(a, "list", "List MAAS workflows", "/v1/workflows", pageUsage{after: "page after this workflow ID", limit: "page size"}, []filter{
		{"site", "only this site"},
		{"state", "running, succeeded or failed"},
	}, func(w *tabwriter.Writer, l proto.List[proto.MAASWorkflow]) {
		row(w, "ID", "KIND", "SITE", "PROFILE", "HOST", "SYSTEM-ID", "STAGE", "STATE", "ATTEMPTS", "LAST-ERROR")
		for _, x := range l.Items {
			row(w, x.ID, x.Kind, x.Site, x.Profile, x.Hostname, x.SystemID, x.Stage, x.State, x.Attempts, firstLine(x.LastError, 60))
		}
	})
	showCmd := idCmd(a, "show", "A workflow with its twelve-bucket timeline: where the time went", http.MethodGet, "/v1/workflows/", "", workflowTable)
	c.AddCommand(list, showCmd)
	return c
}

func firstLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

func workflowTable(w *tabwriter.Writer, v proto.WorkflowView) {
	row(w, "ID:", v.ID)
	row(w, "Kind:", v.Kind)
	row(w, "Site/profile:", v.Site+"/"+v.Profile)
	row(w, "Host:", v.Hostname)
	row(w, "System ID:", v.SystemID)
	row(w, "Stage:", v.Stage)
	row(w, "State:", v.State)
	row(w, "Attempts:", fmt.Sprintf("%d (deploys %d)", v.Attempts, v.DeployAttempts))
	row(w, "Last error:", firstLine(v.LastError, 200))
	fmt.Fprintln(w)
	row(w, "BUCKET", "DURATION", "SHARE", "START", "END")
	for _, b := range v.Timeline {
		if !b.Measured {
			row(w, b.Bucket, "not measured", "", "", "")
			continue
		}
		d := time.Duration(b.DurationSeconds * float64(time.Second)).Round(time.Millisecond).String()
		if b.Open {
			d += " (open)"
		}
		share := ""
		if v.TotalSeconds > 0 && !b.Open {
			share = fmt.Sprintf("%.0f%%", 100*b.DurationSeconds/v.TotalSeconds)
		}
		row(w, b.Bucket, d, share, ts(b.Start), ts(b.End))
	}
	row(w, "TOTAL", time.Duration(v.TotalSeconds*float64(time.Second)).Round(time.Millisecond).String(), "", "", "")
	if len(v.Predeploy) > 0 {
		fmt.Fprintln(w)
		row(w, "PREDEPLOY CHECK", "RESULT", "DETAIL")
		for _, c := range v.Predeploy {
			res := "ok"
			if !c.OK {
				res = "FAILED"
			}
			row(w, c.Name, res, firstLine(c.Detail, 100))
		}
	}
	if len(v.Events) > 0 {
		fmt.Fprintln(w)
		row(w, "AT", "STAGE", "EVENT", "DETAIL")
		for _, e := range v.Events {
			row(w, ts(e.At), e.Stage, e.Kind, firstLine(e.Detail, 100))
		}
	}
}

func (a *app) siteCmd() *cobra.Command {
	c := &cobra.Command{Use: "site", Short: "MAAS sites: onboard and decommission machines"}
	var profile, hostname, bmc, powerType string
	var macs []string
	onboard := &cobra.Command{
		Use:   "onboard SITE",
		Short: "Onboard one machine through the site's MAAS (a durable workflow the leader runs)",
		Args:  exactArgs("SITE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := proto.OnboardBody{Profile: profile, Hostname: hostname, MACs: macs, BMCAddress: bmc, PowerType: powerType}
			r, err := a.call(cmd, http.MethodPost, "/v1/sites/"+pathEscape(args[0])+"/onboard", nil, body, nil)
			if err != nil {
				return err
			}
			return show(a, r, workflowTable)
		},
	}
	onboard.Flags().StringVar(&profile, "profile", "", "site profile (required)")
	onboard.Flags().StringVar(&hostname, "hostname", "", "host name, also the node ID (required)")
	onboard.Flags().StringSliceVar(&macs, "mac", nil, "MAC address (repeatable; the first is the PXE MAC)")
	onboard.Flags().StringVar(&bmc, "bmc", "", "BMC address")
	onboard.Flags().StringVar(&powerType, "power-type", "ipmi", "MAAS power type")
	var dprofile, dhost string
	decommission := &cobra.Command{
		Use:   "decommission SITE",
		Short: "Decommission one node in its profile's release mode",
		Args:  exactArgs("SITE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodPost, "/v1/sites/"+pathEscape(args[0])+"/decommission", nil,
				proto.DecommissionBody{Profile: dprofile, Hostname: dhost}, nil)
			if err != nil {
				return err
			}
			return show(a, r, workflowTable)
		},
	}
	decommission.Flags().StringVar(&dprofile, "profile", "", "site profile (required)")
	decommission.Flags().StringVar(&dhost, "hostname", "", "host name (required)")
	c.AddCommand(onboard, decommission, a.siteIngressCmd())
	return c
}
