// Command gpuaas-daemons shows or stops the shared daemon set the lab and
// the privileged tests start on demand (lab/labhost): the userspace Open
// vSwitch under /run/gpuaas-ovs, virtlogd and libvirtd.
//
//	gpuaas-daemons status   which run, and which processes use them
//	gpuaas-daemons stop     stop the ones labhost started (make clean-daemons)
//
// stop leaves them running, and says who uses them, while a lab or a test
// binary holds its lease; it never touches a daemon started otherwise.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gpuaas/gpuaas/lab/labhost"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-daemons:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: gpuaas-daemons status|stop")
	}
	switch args[0] {
	case "status":
		for _, d := range labhost.Shared() {
			if d.Pid == 0 {
				fmt.Fprintf(out, "%-13s not running\n", d.Name)
			} else {
				fmt.Fprintf(out, "%-13s pid %d (%s)\n", d.Name, d.Pid, d.PidFile)
			}
		}
		if users := labhost.Users(); len(users) > 0 {
			fmt.Fprintf(out, "in use by %s\n", strings.Join(users, ", "))
		} else {
			fmt.Fprintln(out, "in use by no process")
		}
		return nil
	case "stop":
		stopped, err := labhost.StopShared(ctx, func(f string, a ...any) { fmt.Fprintf(out, f+"\n", a...) })
		var inUse *labhost.InUseError
		if errors.As(err, &inUse) {
			fmt.Fprintln(out, err)
			return nil
		}
		if err == nil && len(stopped) == 0 {
			fmt.Fprintln(out, "no shared daemon runs")
		}
		return err
	default:
		return fmt.Errorf("unknown command %q: usage: gpuaas-daemons status|stop", args[0])
	}
}
