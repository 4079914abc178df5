"""Writes of the compliance app, one module per concern: the refusals every write checks first
(`rules`: role, residency, BAA), the audit trail (`audit`) and its export (`export`), residency
policies (`residency`), business associate agreements (`baa`), sensitive objects (`objects`),
retention and organization deletion (`retention`) and two-factor authentication (`totp`). Raw
traffic uploads, which store and read sensitive objects, live with the traffic app
(`portal.traffic.raw_uploads`). This package re-exports their functions, so callers import
`compliance.services` as before.

Every mutating function takes the acting user, checks the actor's role itself and writes its
audit event in the same transaction. Refusals are `ValidationError`s whose message names the
rule that refused ("data-residency rule", "BAA rule"), so the UI and the API can say why.
"""

from compliance.services.audit import (
    BrokenLink,
    _verify_chain,
    audit_record,
    audit_verify,
    staff_access_record,
)
from compliance.services.baa import (
    BAA_DOCUMENT_MAX_BYTES,
    baa_countersign,
    baa_document_problem,
    baa_record_create,
    is_provider,
)
from compliance.services.export import audit_export
from compliance.services.objects import (
    sensitive_object_delete,
    sensitive_object_read,
    sensitive_object_store,
    upload_admit,
)
from compliance.services.residency import residency_policy_set, residency_require_hardware
from compliance.services.retention import (
    MIN_METRIC_RETENTION_DAYS,
    organization_data_delete,
    retention_enforce,
    retention_policy_set,
)
from compliance.services.rules import _require, baa_require, residency_require, storage_region_for
from compliance.services.totp import (
    RECOVERY_CODE_COUNT,
    totp_enroll_start,
    totp_recovery_codes_create,
    totp_verify,
)

__all__ = [
    "BAA_DOCUMENT_MAX_BYTES",
    "MIN_METRIC_RETENTION_DAYS",
    "RECOVERY_CODE_COUNT",
    "BrokenLink",
    "_require",
    "_verify_chain",
    "audit_export",
    "audit_record",
    "audit_verify",
    "baa_countersign",
    "baa_document_problem",
    "baa_record_create",
    "baa_require",
    "is_provider",
    "organization_data_delete",
    "residency_policy_set",
    "residency_require",
    "residency_require_hardware",
    "retention_enforce",
    "retention_policy_set",
    "sensitive_object_delete",
    "sensitive_object_read",
    "sensitive_object_store",
    "staff_access_record",
    "storage_region_for",
    "totp_enroll_start",
    "totp_recovery_codes_create",
    "totp_verify",
    "upload_admit",
]
