package cli

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

// App instances: launch, status, logs, stop and the instances of an
// allocation (proto/appinstance.go).

func instancePath(alloc, app string) string {
	return "/v1/allocations/" + pathEscape(alloc) + "/apps/" + pathEscape(app)
}

func endpointsOf(eps map[string]string) string {
	ks := make([]string, 0, len(eps))
	for k := range eps {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

func instanceTable(w *tabwriter.Writer, l proto.List[proto.AppInstance]) {
	row(w, "APP", "VERSION", "STATE", "PORTS", "INSTANCE", "UPDATED", "DETAIL")
	for _, x := range l.Items {
		row(w, x.App, x.Version, x.State, endpointsOf(x.Endpoints), x.ID, x.UpdatedAt.Format(time.RFC3339), x.Detail)
	}
}

func instanceDetail(w *tabwriter.Writer, x proto.AppInstance) {
	row(w, "App:", x.App+":"+x.Version)
	row(w, "Instance:", x.ID)
	row(w, "Allocation:", x.AllocationID)
	row(w, "Node:", x.NodeID)
	row(w, "State:", x.State)
	if x.Detail != "" {
		row(w, "Detail:", x.Detail)
	}
	row(w, "Image:", x.Image)
	row(w, "Launched by:", x.LaunchedBy)
	if x.State == proto.AppInstanceRunning {
		row(w, "Proxy:", x.ProxyPath)
		row(w, "Ports:", endpointsOf(x.Endpoints))
	}
	if x.Deadline != nil {
		row(w, "Deadline:", x.Deadline.Format(time.RFC3339))
	}
	for _, e := range x.Events {
		row(w, "  "+e.At.Format(time.RFC3339), e.State, e.Message)
	}
}

// splitLaunch parses APP or APP:VERSION.
func splitLaunch(s string) (string, string, error) {
	name, version, _ := strings.Cut(s, ":")
	if err := proto.ValidateID("app name", name); err != nil {
		return "", "", usageError{err}
	}
	if version != "" {
		if err := proto.ValidateAppKey(name, version); err != nil {
			return "", "", usageError{err}
		}
	}
	return name, version, nil
}

func (a *app) appLaunchCmd() *cobra.Command {
	var key string
	var wait bool
	var waitLimit time.Duration
	c := &cobra.Command{
		Use:   "launch ALLOCATION APP[:VERSION]",
		Short: "Launch an app on one of your allocations (VERSION: its newest approved one)",
		Long: "Launch an approved app on an allocation you own. The idempotency key makes retries safe: the\n" +
			"same key returns the same instance. With --wait the command follows the instance live, one\n" +
			"line per state (pending, starting, running), and prints where the workload proxy serves it;\n" +
			"a failure prints why and exits 1.",
		Example: "  gpuaasctl app launch a-7f3c hello\n  gpuaasctl app launch a-7f3c hello:1.0.0 --wait",
		Args:    exactArgs("ALLOCATION", "APP[:VERSION]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitLaunch(args[1])
			if err != nil {
				return err
			}
			r, err := a.createIdempotent(cmd, "/v1/allocations/"+pathEscape(args[0])+"/apps", proto.AppLaunchBody{App: name, Version: version},
				key, "the instance it launched")
			if err != nil {
				return err
			}
			if !wait {
				return show(a, r, instanceDetail)
			}
			inst, err := decode[proto.AppInstance](r)
			if err != nil {
				return err
			}
			if a.output != "json" {
				fmt.Fprintf(a.out, "app %s:%s launched on %s (instance %s); following it (Ctrl-C stops following, not the app)\n",
					inst.App, inst.Version, inst.AllocationID, inst.ID)
			}
			return a.followInstance(cmd, inst.AllocationID, inst.App, waitLimit, proto.AppInstanceRunning)
		},
	}
	f := c.Flags()
	f.StringVar(&key, "idempotency-key", "", "idempotency key (generated and printed when absent)")
	f.BoolVar(&wait, "wait", false, "follow the instance until it is running (prints its proxy URL path) or failed (exit 1)")
	f.DurationVar(&waitLimit, "wait-timeout", 10*time.Minute, "how long --wait follows before giving up")
	return c
}

// followInstance prints each state of an instance until it reaches want
// (or ends otherwise: an error naming why).
func (a *app) followInstance(cmd *cobra.Command, alloc, app string, limit time.Duration, want proto.AppInstanceState) error {
	deadline := time.Now().Add(limit)
	printed := 0
	return watch(a, cmd, instancePath(alloc, app), nil, "", func(inst proto.AppInstance) uint64 { return inst.ModifyIndex },
		func(r *Response, inst proto.AppInstance, _ int) (bool, error) {
			if a.output != "json" {
				for _, e := range inst.Events[min(printed, len(inst.Events)):] {
					fmt.Fprintf(a.out, "%s  %-8s %s\n", e.At.Local().Format("15:04:05"), e.State, e.Message)
				}
			}
			printed = len(inst.Events)
			switch {
			case inst.State == want:
				if a.output == "json" {
					return true, show(a, r, instanceDetail)
				}
				if want == proto.AppInstanceRunning {
					fmt.Fprintf(a.out, "running: %s%s (with your token; WebSockets too)\n", strings.TrimRight(a.baseURL(), "/"), inst.ProxyPath)
				}
				return true, nil
			case inst.State.Terminal():
				return true, fmt.Errorf("app %s on %s is %s: %s", app, alloc, inst.State, inst.Detail)
			}
			if time.Now().After(deadline) {
				return true, fmt.Errorf("app %s on %s is still %s after %s (--wait-timeout); it goes on", app, alloc, inst.State, limit)
			}
			return false, nil
		})
}

func (a *app) appStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status ALLOCATION APP",
		Short: "Show an app instance: state, ports, proxy path and its timeline",
		Args:  exactArgs("ALLOCATION", "APP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodGet, instancePath(args[0], args[1]), nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, instanceDetail)
		},
	}
}

func (a *app) appLogsCmd() *cobra.Command {
	var maxBytes int
	c := &cobra.Command{
		Use:   "logs ALLOCATION APP",
		Short: "Print the end of an app instance's output (fetched from its agent)",
		Args:  exactArgs("ALLOCATION", "APP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if maxBytes < 1 || maxBytes > proto.MaxAppLogBytes {
				return usagef("--max-bytes %d is out of range 1-%d", maxBytes, proto.MaxAppLogBytes)
			}
			r, err := a.call(cmd, http.MethodGet, instancePath(args[0], args[1])+"/logs", map[string]string{"max_bytes": strconv.Itoa(maxBytes)}, nil, nil)
			if err != nil {
				return err
			}
			if a.output == "json" {
				return show(a, r, func(*tabwriter.Writer, proto.AppLogs) {})
			}
			l, err := decode[proto.AppLogs](r)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(a.out, l.Logs)
			return err
		},
	}
	c.Flags().IntVar(&maxBytes, "max-bytes", 64<<10, "at most this many bytes of the end of the output")
	return c
}

func (a *app) appStopCmd() *cobra.Command {
	var wait bool
	var waitLimit time.Duration
	c := &cobra.Command{
		Use:   "stop ALLOCATION APP",
		Short: "Stop an app instance (its container is stopped and removed)",
		Args:  exactArgs("ALLOCATION", "APP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodPost, instancePath(args[0], args[1])+"/stop", nil, nil, nil)
			if err != nil {
				return err
			}
			if !wait {
				return show(a, r, instanceDetail)
			}
			return a.followInstance(cmd, args[0], args[1], waitLimit, proto.AppInstanceStopped)
		},
	}
	c.Flags().BoolVar(&wait, "wait", false, "follow the instance until it is stopped")
	c.Flags().DurationVar(&waitLimit, "wait-timeout", 5*time.Minute, "how long --wait follows before giving up")
	return c
}

func (a *app) appInstancesCmd() *cobra.Command {
	var page func(map[string]string) map[string]string
	c := &cobra.Command{
		Use:   "instances ALLOCATION",
		Short: "List the app instances of an allocation",
		Args:  exactArgs("ALLOCATION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return listPage(a, cmd, "/v1/allocations/"+pathEscape(args[0])+"/apps", page(nil), instanceTable)
		},
	}
	page = pageFlags(c, plainPage)
	return c
}

// baseURL is the API's base URL as the flags and environment name it
// ("" when it does not parse).
func (a *app) baseURL() string {
	base, err := ParseAddr(a.apiAddr())
	if err != nil {
		return ""
	}
	return base.String()
}
