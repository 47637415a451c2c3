// Command gpuaas-agent is the node agent: one per host, a Type=notify
// systemd unit (agent/systemd). Configuration: flags, GPUAAS_AGENT_*
// environment variables, an optional JSON file (agent/config).
package main

import (
	"os"

	"github.com/gpuaas/gpuaas/agent/daemon"
)

func main() { os.Exit(daemon.Main("gpuaas-agent", os.Args[1:], nil)) }
