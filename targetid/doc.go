// Package targetid owns the identifier every other package uses for one
// routing target: a pod endpoint and a data-parallel rank (ID), and its
// rendering as the "endpoint#rank" label shared by metrics and logs.
//
// It is a leaf with no dependencies so that kvindex, health, the event
// plane and the router can share the type without importing each other.
package targetid
