// Command gpuaasctl is the gpuaas operator CLI (package coordinator/cli).
//
//	export GPUAAS_ADDR=127.0.0.1:7300 GPUAAS_TOKEN_FILE=lab/c1/admin.token
//	gpuaasctl availability
//	gpuaasctl alloc create --gpus 2 --region us-east
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpuaas/gpuaas/coordinator/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
