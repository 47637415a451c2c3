// Command maassim serves the MAAS 2.0 API simulator (lab/maassim) on a
// loopback address for the lab.
//
//	maassim -listen 127.0.0.1:5240 -speed 600 -api-key consumer:token:secret \
//	        -subnet 10.10.0.0/24 -hardware 52:54:00:00:00:15=j22u15 -deployed-dir /run/lab/deployed
//
// With -speed 600 virtual time runs 600 times faster than real time (a
// 12-minute deploy takes 1.2 s); -speed 0 uses a manual clock advanced
// through POST /_sim/clock/advance?d=10m. With -deployed-dir, each machine
// that reaches Deployed gets <dir>/<system_id>.user-data (the decoded
// cloud-init user-data) and <dir>/<system_id>.json (its identity), which
// the lab watches to boot that machine's agent.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/lab/maassim"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], nil); err != nil {
		fmt.Fprintln(os.Stderr, "maassim:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends; ready (if non-nil) receives the bound address.
func run(ctx context.Context, args []string, ready func(addr string)) error {
	fs := flag.NewFlagSet("maassim", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:5240", "listen address (loopback only)")
	speed := fs.Float64("speed", 600, "virtual-time speed factor; 0 = manual clock")
	deployedDir := fs.String("deployed-dir", "", "directory receiving <system_id>.user-data when a machine is Deployed")
	var keys, subnets, hardware listFlag
	fs.Var(&hardware, "hardware", "MAC=hostsim-profile: what commissioning finds on the machine with that MAC (repeatable)")
	fs.Var(&keys, "api-key", "accepted API key consumer:token:secret (repeatable)")
	fs.Var(&subnets, "subnet", "subnet CIDR[,vid[,gateway]] (repeatable)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("parse flags: %w", err)
	}
	for _, k := range keys {
		if len(strings.Split(k, ":")) != 3 {
			return fmt.Errorf("-api-key %q: want consumer:token:secret", k)
		}
	}

	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("parse -listen %q: %w", *listen, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("-listen %q: only loopback addresses are allowed", *listen)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	opts := maassim.Options{APIKeys: keys, Logger: log}
	if *speed == 0 {
		opts.Clock = maassim.NewManualClock(time.Now())
	} else {
		opts.Clock = maassim.NewScaledClock(time.Now(), *speed)
	}
	for i, sn := range subnets {
		parts := strings.Split(sn, ",")
		if _, _, err := net.ParseCIDR(parts[0]); err != nil {
			return fmt.Errorf("parse -subnet %q: %w", sn, err)
		}
		s := maassim.Subnet{ID: i + 1, CIDR: parts[0]}
		if len(parts) > 1 {
			if _, err := fmt.Sscanf(parts[1], "%d", &s.VID); err != nil {
				return fmt.Errorf("parse -subnet %q vid: %w", sn, err)
			}
		}
		if len(parts) > 2 {
			s.GatewayIP = parts[2]
		}
		opts.Subnets = append(opts.Subnets, s)
	}
	if *deployedDir != "" {
		if err := os.MkdirAll(*deployedDir, 0o750); err != nil {
			return fmt.Errorf("create -deployed-dir: %w", err)
		}
		dir := *deployedDir
		opts.OnDeployed = func(d maassim.Deployed) {
			if err := writeDeployed(dir, d); err != nil {
				log.Error("maassim: record deployed machine", "system_id", d.SystemID, "err", err)
			}
		}
	}
	srv := maassim.New(opts)
	for _, h := range hardware {
		mac, profile, ok := strings.Cut(h, "=")
		if !ok {
			return fmt.Errorf("-hardware %q: want MAC=profile", h)
		}
		hw, err := maassim.HardwareFromHostsim(profile)
		if err != nil {
			return fmt.Errorf("-hardware %q: %w", h, err)
		}
		if err := srv.SetHardware(mac, hw); err != nil {
			return fmt.Errorf("-hardware %q: %w", h, err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	log.Info("maassim serving", "url", "http://"+ln.Addr().String()+"/MAAS/", "speed", *speed)
	if ready != nil {
		ready(ln.Addr().String())
	}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(shut)
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func writeDeployed(dir string, d maassim.Deployed) error {
	if strings.ContainsAny(d.SystemID, "/\\.") || d.SystemID == "" {
		return fmt.Errorf("refusing system_id %q as a file name", d.SystemID)
	}
	meta, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", d.SystemID, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, d.SystemID+".user-data"), d.UserData, 0o600); err != nil {
		return fmt.Errorf("write user-data of %s: %w", d.SystemID, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, d.SystemID+".json"), meta, 0o600); err != nil {
		return fmt.Errorf("write identity of %s: %w", d.SystemID, err)
	}
	return nil
}
