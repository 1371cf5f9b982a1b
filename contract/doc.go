// Package contract is the operator–worker contract, the one package both sides import: the worker
// pod's labels, annotations, container name and config file path (the operator creates worker
// pods, the worker binary or the test node agent runs them); the worker Config the operator writes
// into the pod and the worker reads; the Result the worker writes to its container's termination
// message, its parser and the failure classes (Reason) the operator's retry and status logic reads.
//
// It imports only the standard library, sigs.k8s.io/yaml and the kmm API types, so that the
// operator links none of the worker's node-side code (image pulls, archive extraction, modprobe).
package contract
