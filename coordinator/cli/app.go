package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// appTargets and compatibleApps mirror the API's answers (coordinator/api
// AppTargets, CompatibleApps).
type appTargets struct {
	App          string             `json:"app"`
	Version      string             `json:"version"`
	Compatible   []sched.AppVerdict `json:"compatible"`
	Incompatible []sched.AppVerdict `json:"incompatible"`
	Index        uint64             `json:"index"`
}

type compatibleApps struct {
	AllocationID string             `json:"allocation_id"`
	Compatible   []sched.AppVerdict `json:"compatible"`
	Incompatible []sched.AppVerdict `json:"incompatible"`
	Index        uint64             `json:"index"`
}

// splitApp parses NAME:VERSION.
func splitApp(s string) (string, string, error) {
	name, version, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", usagef("%q: name the app as NAME:VERSION", s)
	}
	if err := proto.ValidateAppKey(name, version); err != nil {
		return "", "", usageError{err}
	}
	return name, version, nil
}

func appPath(name, version string) string {
	return "/v1/apps/" + pathEscape(name) + "/" + pathEscape(version)
}

func appTable(w *tabwriter.Writer, l proto.List[proto.App]) {
	row(w, "NAME", "VERSION", "KIND", "STATE", "SHAPES", "GPUS", "IMAGE")
	for _, x := range l.Items {
		row(w, x.Name, x.Version, x.Kind, x.State, shapesOf(x.Compat.Shapes), gpuRange(x.Compat), x.Image)
	}
}

func shapesOf(ss []proto.CapacityShape) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return strings.Join(out, ",")
}

func gpuRange(c proto.AppCompat) string {
	switch {
	case c.MinGPUs == 0 && c.MaxGPUs == 0:
		return "any"
	case c.MaxGPUs == 0:
		return strconv.Itoa(c.MinGPUs) + "+"
	}
	return fmt.Sprintf("%d-%d", c.MinGPUs, c.MaxGPUs)
}

func appDetail(w *tabwriter.Writer, x proto.App) {
	row(w, "App:", x.Name+":"+x.Version)
	row(w, "Kind:", x.Kind)
	row(w, "Image:", x.Image)
	row(w, "Description:", x.Description)
	row(w, "State:", x.State)
	c := x.Compat
	row(w, "Shapes:", shapesOf(c.Shapes))
	row(w, "GPUs:", gpuRange(c))
	if len(c.ImageKinds) > 0 {
		ks := make([]string, len(c.ImageKinds))
		for i, k := range c.ImageKinds {
			ks[i] = string(k)
		}
		row(w, "Guest image:", strings.Join(ks, " or "))
	}
	if c.MinGPUMemoryMiB > 0 {
		row(w, "GPU memory:", fmt.Sprintf(">= %d MiB", c.MinGPUMemoryMiB))
	}
	topo := c.Topology
	if topo == "" {
		topo = proto.AppSingleAllocation
	}
	row(w, "Topology:", topo)
	row(w, "Needs fabric:", yesNo(c.NeedsFabric))
	row(w, "Needs ingress:", yesNo(c.NeedsIngress))
	for _, p := range x.Ports {
		row(w, "Port:", fmt.Sprintf("%s %d/%s", p.Name, p.Port, p.Protocol))
	}
	if hc := x.HealthCheck; hc != nil {
		row(w, "Health check:", fmt.Sprintf("port %d %s", hc.Port, hc.Path))
	}
	row(w, "Created:", ts(x.CreatedAt))
	for _, ap := range x.Approvals {
		row(w, "Decision:", fmt.Sprintf("%s by %s at %s %s", ap.Action, ap.By, ts(ap.At), ap.Note))
	}
}

func reasonsOf(v sched.AppVerdict) string {
	ms := make([]string, len(v.Reasons))
	for i, r := range v.Reasons {
		ms[i] = r.Message
	}
	return strings.Join(ms, "; ")
}

func (a *app) appCmd() *cobra.Command {
	c := &cobra.Command{Use: "app", Aliases: []string{"apps"}, Short: "The app catalog, the target picker and the apps running on allocations"}
	list := pagedList[proto.App](a, "List the app catalog", "/v1/apps", appTable)
	list.Aliases = []string{"ls"}
	c.AddCommand(list, a.appShowCmd(), a.appPublishCmd(), a.appDecideCmd("approve", proto.ImageApproved),
		a.appDecideCmd("revoke", proto.ImageRevoked), a.appTargetsCmd(), a.appCompatibleCmd(),
		a.appLaunchCmd(), a.appStatusCmd(), a.appLogsCmd(), a.appStopCmd(), a.appInstancesCmd())
	return c
}

func (a *app) appShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME:VERSION",
		Short: "Show an app manifest with its approvals",
		Args:  exactArgs("NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitApp(args[0])
			if err != nil {
				return err
			}
			r, err := a.call(cmd, http.MethodGet, appPath(name, version), nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, appDetail)
		},
	}
}

func (a *app) appPublishCmd() *cobra.Command {
	var archive string
	c := &cobra.Command{
		Use:   "publish NAME:VERSION MANIFEST.json [--archive FILE]",
		Short: "Create or update a pending app manifest, and upload its image archive (admin)",
		Long: "Reads MANIFEST.json (kind, image by digest, compat, ports, health_check; unknown fields are refused)\n" +
			"and creates the pending catalog entry NAME:VERSION. With --archive, then uploads FILE (the app's\n" +
			"OCI image layout archive) to the leader's blob store, which checks it against the manifest's\n" +
			"digest and image_size (the leader, so that the upload is audited: a follower stores a blob\n" +
			"without a record). Approve it with 'gpuaasctl app approve'.",
		Example: "  gpuaasctl app publish hello-http:1 hello-http.json\n" +
			"  gpuaasctl app publish hello:1.0.0 .lab/hello.json --archive bin/apps/hello.oci.tar",
		Args: exactArgs("NAME:VERSION", "MANIFEST.json"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitApp(args[0])
			if err != nil {
				return err
			}
			raw, err := os.ReadFile(args[1])
			if err != nil {
				return usageError{err}
			}
			var body proto.AppBody
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&body); err != nil {
				return usagef("%s: %v", args[1], err)
			}
			var f *os.File
			var size int64
			if archive != "" {
				// Checked before anything is published.
				if f, err = os.Open(archive); err != nil {
					return usageError{fmt.Errorf("--archive: %w", err)}
				}
				defer f.Close()
				fi, err := f.Stat()
				if err != nil {
					return fmt.Errorf("--archive: %w", err)
				}
				size = fi.Size()
			}
			r, err := a.call(cmd, http.MethodPut, appPath(name, version), nil, body, nil)
			if err != nil {
				return err
			}
			if f != nil {
				cl, err := a.leaderClient(cmd)
				if err != nil {
					return fmt.Errorf("app %s:%s is published; upload its archive: %w", name, version, err)
				}
				fmt.Fprintf(a.errOut, "uploading %s (%d bytes) to the leader %s\n", archive, size, cl.Base.Host)
				if r, err = cl.Upload(cmd.Context(), appPath(name, version)+"/blob", f, size); err != nil {
					return fmt.Errorf("app %s:%s is published; upload of %s: %w", name, version, archive, err)
				}
			}
			return show(a, r, appDetail)
		},
	}
	c.Flags().StringVar(&archive, "archive", "", "the app's OCI image layout archive: uploaded to the leader after publishing")
	return c
}

func (a *app) appDecideCmd(verb string, action proto.AppState) *cobra.Command {
	var note, image string
	c := &cobra.Command{
		Use:   verb + " NAME:VERSION",
		Short: map[proto.AppState]string{proto.ImageApproved: "Approve an app version (admin)", proto.ImageRevoked: "Revoke an app version (admin)"}[action],
		Args:  exactArgs("NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitApp(args[0])
			if err != nil {
				return err
			}
			r, err := a.call(cmd, http.MethodPost, appPath(name, version)+"/"+verb, nil, proto.AppApproveBody{Note: note, Image: image}, nil)
			if err != nil {
				return err
			}
			return show(a, r, appDetail)
		},
	}
	c.Flags().StringVar(&note, "note", "", "why (recorded with the decision)")
	c.Flags().StringVar(&image, "image", "", "refuse unless the manifest runs this image (repo@sha256:...)")
	return c
}

func (a *app) appTargetsCmd() *cobra.Command {
	var version, owner string
	c := &cobra.Command{
		Use:   "targets NAME",
		Short: "Which of your allocations can run an app, and why not the others",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := proto.ValidateID("app name", args[0]); err != nil {
				return usageError{err}
			}
			r, err := a.call(cmd, http.MethodGet, "/v1/apps/"+pathEscape(args[0])+"/targets", map[string]string{"version": version, "owner": owner}, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, t appTargets) {
				row(w, "ALLOCATION", "APP", "COMPATIBLE", "WHY NOT")
				for _, v := range t.Compatible {
					row(w, v.AllocationID, t.App+":"+t.Version, "yes", "")
				}
				for _, v := range t.Incompatible {
					row(w, v.AllocationID, t.App+":"+t.Version, "no", reasonsOf(v))
				}
			})
		},
	}
	c.Flags().StringVar(&version, "version", "", "judge this version (default: the newest approved)")
	c.Flags().StringVar(&owner, "owner", "", "admin: another owner's allocations")
	return c
}

func (a *app) appCompatibleCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "compatible ALLOCATION",
		Short: "Which apps an allocation can run, and why not the others",
		Args:  exactArgs("ALLOCATION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := proto.ValidateID("allocation id", args[0]); err != nil {
				return usageError{err}
			}
			r, err := a.call(cmd, http.MethodGet, "/v1/allocations/"+pathEscape(args[0])+"/apps/compatible", nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, c compatibleApps) {
				row(w, "APP", "COMPATIBLE", "WHY NOT")
				for _, v := range c.Compatible {
					row(w, v.App+":"+v.Version, "yes", "")
				}
				for _, v := range c.Incompatible {
					row(w, v.App+":"+v.Version, "no", reasonsOf(v))
				}
			})
		},
	}
}
