// Package upgrade drives the ordered upgrade of seed 002 through node labels: from the user's
// version-module label it moves the internal version-schedule-pod and version-worker-pod labels
// one step at a time, so that the device plugin leaves a node before its module is unloaded and
// comes back only after the new version is loaded. The decisions here are pure.
package upgrade
