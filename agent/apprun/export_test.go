package apprun

// Internal names the external (apprun_test) tests check.
var (
	ContainerName = containerName
	NetnsName     = netnsName
)
