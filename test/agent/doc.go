// Package agent is the test node agent: it plays the kubelet for simulated nodes in integration
// tests that run against a real kube-apiserver and etcd (test/envtest) with no kubelet, scheduler or
// kube-controller-manager.
//
// An Agent creates the Nodes it manages (AddNode) and keeps their status what the test said: kernel
// version, boot ID and a Ready condition. It watches worker pods (label contract.LabelWorker=true)
// bound to those nodes and "runs" them the way a kubelet running the real worker binary would: it
// reads the worker Config from the pod annotation, decides the outcome with a pure OutcomeFunc
// (DefaultOutcome unless the test chose another), keeps a simulated set of loaded modules per node,
// and writes the pod's terminal status through the status subresource with the contract.Result JSON
// as the container's termination message. It confirms the deletion of terminating pods (deleting
// them with grace period 0, as a kubelet does) and simulates reboots, kernel upgrades and NotReady
// nodes. Pods on nodes the agent does not manage are left alone, so several agents can share one
// API server.
//
// For scale tests (test/scale, issue 41) a worker pod may run for a time of its own
// (Options.RunDelayFor: a pull time), Nodes may look like a real kubelet's (Options.RealNodes:
// images, every condition, system info), the agent may renew each node's Lease and post its
// status again as a kubelet does (Options.LeasePeriod, Options.StatusPeriod; heartbeat.go), and
// it may watch only the pods a selector picks (Options.PodSelector).
//
// Everything the agent writes goes to the API server; tests assert on the API objects, and on
// Loaded and Runs for what the simulated kernel and worker did.
package agent
