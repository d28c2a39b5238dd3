/*
 * GSS-API stand-ins for the static prefixrouter binary of the container image.
 *
 * Debian's libzmq.a is built with GSS-API support and references these
 * symbols, but Debian ships MIT Kerberos as shared libraries only (no
 * libgssapi_krb5.a), so a fully static link needs them from somewhere.
 * libzmq calls them only on a socket whose ZMQ_GSSAPI_SERVER or
 * ZMQ_GSSAPI_CLIENT option is set; prefixrouter sets neither (its KV-event
 * sockets use ZeroMQ's NULL mechanism, and a peer offering another
 * mechanism is refused during the ZMTP greeting, before any of these would
 * run). Were one ever called, it fails with GSS_S_FAILURE and the handshake
 * fails: never a success without Kerberos.
 *
 * Prototypes come from <gssapi/gssapi.h> (libkrb5-dev, a dependency of
 * libzmq3-dev), so a signature that drifts fails to compile.
 */
#include <gssapi/gssapi.h>
#include <stddef.h>

static OM_uint32 refuse(OM_uint32 *minor) {
	if (minor != NULL)
		*minor = 0;
	return GSS_S_FAILURE;
}

static gss_OID_desc nt_user_name = {10, "\x2a\x86\x48\x86\xf7\x12\x01\x02\x01\x01"};
static gss_OID_desc nt_hostbased_service = {10, "\x2a\x86\x48\x86\xf7\x12\x01\x02\x01\x04"};
gss_OID GSS_C_NT_USER_NAME = &nt_user_name;
gss_OID GSS_C_NT_HOSTBASED_SERVICE = &nt_hostbased_service;

OM_uint32 gss_acquire_cred(OM_uint32 *minor, gss_name_t name, OM_uint32 time_req, gss_OID_set mechs,
                           gss_cred_usage_t usage, gss_cred_id_t *cred, gss_OID_set *actual, OM_uint32 *time_rec) {
	(void)name; (void)time_req; (void)mechs; (void)usage; (void)actual; (void)time_rec;
	if (cred != NULL)
		*cred = GSS_C_NO_CREDENTIAL;
	return refuse(minor);
}

OM_uint32 gss_release_cred(OM_uint32 *minor, gss_cred_id_t *cred) {
	(void)cred;
	return refuse(minor);
}

OM_uint32 gss_init_sec_context(OM_uint32 *minor, gss_cred_id_t cred, gss_ctx_id_t *ctx, gss_name_t target,
                               gss_OID mech, OM_uint32 flags, OM_uint32 time_req, gss_channel_bindings_t bindings,
                               gss_buffer_t in, gss_OID *actual_mech, gss_buffer_t out, OM_uint32 *ret_flags,
                               OM_uint32 *time_rec) {
	(void)cred; (void)ctx; (void)target; (void)mech; (void)flags; (void)time_req; (void)bindings;
	(void)in; (void)actual_mech; (void)ret_flags; (void)time_rec;
	if (out != NULL) {
		out->length = 0;
		out->value = NULL;
	}
	return refuse(minor);
}

OM_uint32 gss_accept_sec_context(OM_uint32 *minor, gss_ctx_id_t *ctx, gss_cred_id_t cred, gss_buffer_t in,
                                 gss_channel_bindings_t bindings, gss_name_t *src, gss_OID *mech, gss_buffer_t out,
                                 OM_uint32 *ret_flags, OM_uint32 *time_rec, gss_cred_id_t *delegated) {
	(void)ctx; (void)cred; (void)in; (void)bindings; (void)src; (void)mech; (void)ret_flags; (void)time_rec;
	(void)delegated;
	if (out != NULL) {
		out->length = 0;
		out->value = NULL;
	}
	return refuse(minor);
}

OM_uint32 gss_delete_sec_context(OM_uint32 *minor, gss_ctx_id_t *ctx, gss_buffer_t out) {
	(void)ctx; (void)out;
	return refuse(minor);
}

OM_uint32 gss_wrap(OM_uint32 *minor, gss_ctx_id_t ctx, int conf_req, gss_qop_t qop, gss_buffer_t in, int *conf_state,
                   gss_buffer_t out) {
	(void)ctx; (void)conf_req; (void)qop; (void)in; (void)conf_state; (void)out;
	return refuse(minor);
}

OM_uint32 gss_unwrap(OM_uint32 *minor, gss_ctx_id_t ctx, gss_buffer_t in, gss_buffer_t out, int *conf_state,
                     gss_qop_t *qop) {
	(void)ctx; (void)in; (void)out; (void)conf_state; (void)qop;
	return refuse(minor);
}

OM_uint32 gss_display_name(OM_uint32 *minor, gss_name_t name, gss_buffer_t out, gss_OID *type) {
	(void)name; (void)out; (void)type;
	return refuse(minor);
}

OM_uint32 gss_import_name(OM_uint32 *minor, gss_buffer_t in, gss_OID type, gss_name_t *out) {
	(void)in; (void)type;
	if (out != NULL)
		*out = GSS_C_NO_NAME;
	return refuse(minor);
}

OM_uint32 gss_release_name(OM_uint32 *minor, gss_name_t *name) {
	(void)name;
	return refuse(minor);
}

OM_uint32 gss_release_buffer(OM_uint32 *minor, gss_buffer_t buf) {
	(void)buf;
	return refuse(minor);
}
