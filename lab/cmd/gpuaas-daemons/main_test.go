package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRunArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"status", "stop"}} {
		require.ErrorContains(t, run(context.Background(), args, &bytes.Buffer{}), "usage: gpuaas-daemons status|stop")
	}
	require.ErrorContains(t, run(context.Background(), []string{"restart"}, &bytes.Buffer{}), `unknown command "restart"`)
}

func TestStatusNamesEveryDaemon(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"status"}, &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, out.String())
	for i, name := range []string{"libvirtd", "virtlogd", "ovs-vswitchd", "ovsdb-server"} {
		require.True(t, strings.HasPrefix(lines[i], name+" "), lines[i])
		require.True(t, strings.Contains(lines[i], "not running") || strings.Contains(lines[i], "pid "), lines[i])
	}
	require.True(t, strings.HasPrefix(lines[4], "in use by "), lines[4])
}
