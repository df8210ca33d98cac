"""dropportal's admin site: the staff dashboard is its index page.

``dropportal.apps.DropportalAdminConfig`` makes this the default site, so every
``@admin.register`` in ``integrations/admin/`` lands here. It lives outside
``integrations.admin`` on purpose: importing that package registers the ModelAdmins, which
must not happen while the default site itself is being built.

No search puts a clear email or phone in a URL (so in the access logs): every list's search
box posts (``templates/admin/search_form.html``), the answer is a redirect whose ``q`` is the
term's hash, and a ``q`` in a URL that is a clear email or phone is refused, not searched.

A staff member who must use a second factor (``staff_mfa_required``) has no access until
they passed it this session: the login sends them to ``/admin/mfa/`` (or to enrolment).

With the company's identity provider set (``DROPPORTAL_OIDC_ISSUER``,
``integrations/admin/oidc.py``) the login page offers it beside the password, or instead of
it with ``DROPPORTAL_OIDC_ONLY`` (a password posted anyway is refused here, unchecked and
unrecorded); the provider's MFA, when its ID token says so, stands for ours; the logout of a
session opened there goes on to the provider's end-session endpoint.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from typing import Any, TypeVar, cast

from django.conf import settings
from django.contrib import messages
from django.contrib.admin import FieldListFilter, ModelAdmin, RelatedFieldListFilter
from django.contrib.admin import action as admin_action
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import NotRelationField, get_fields_from_path
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.fields.array import (  # type: ignore[attr-defined]  # no stubs
    IndexTransform,
    SliceTransform,
)
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db.models import BLANK_CHOICE_DASH, ForeignObjectRel, Lookup, Model, QuerySet
from django.db.models.base import ModelBase
from django.db.models.sql.where import WhereNode
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseBase,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path, reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.functional import SimpleLazyObject
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import cache_control
from django.views.decorators.debug import sensitive_post_parameters
from unfold.sites import UnfoldAdminSite

from integrations.drop.calendar import drop_timezone
from integrations.storable_text import unstorable_reason

_ModelT = TypeVar("_ModelT", bound=Model)
# Read by unfold's templates of every ModelAdmin (see DropportalAdminSite.register).
_UNFOLD_OPTIONAL_ATTRIBUTES: dict[str, Callable[[], Any]] = {
    "conditional_fields": dict,
    "list_sections": list,
}


# Where a request keeps whether its member passed the second factor, read once a request.
_SECOND_FACTOR_PASSED = "_dp_second_factor_passed"


@admin_action(
    permissions=["delete"], description=gettext_lazy("Delete selected %(verbose_name_plural)s")
)
def _delete_selected_bounded(
    modeladmin: ModelAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> HttpResponse | None:
    """Django's "Delete selected" on one run of the selection
    (``integrations.admin.bounded_actions.delete_selected``). Imported when called: importing
    ``integrations.admin`` while a site is being built registers its ModelAdmins on another
    (see the module docstring)."""
    from integrations.admin.bounded_actions import delete_selected

    return delete_selected(modeladmin, request, queryset)


class DropportalAdminSite(UnfoldAdminSite):
    site_header = "dropportal"
    site_title = "dropportal"
    index_title = "Dashboard"

    def __init__(self, name: str = "admin") -> None:
        super().__init__(name)
        # Every list offering "Delete selected" (consumers, canaries, staff, groups, sign-in
        # logs) takes it from its site: each site replaces Django's with the bounded one.
        self.add_action(_delete_selected_bounded, "delete_selected")

    def get_urls(self) -> list[URLPattern | URLResolver]:
        # Imported when called, not above: see the module docstring.
        from integrations.admin.audit import drop_metrics_view, evidence_view
        from integrations.admin.cycle_files import cycle_response_files_view
        from integrations.admin.guide import broker_guide_view
        from integrations.admin.mfa import (
            mfa_enrol_view,
            mfa_logout_view,
            mfa_recovery_codes_view,
            mfa_verify_view,
        )
        from integrations.admin.oidc import oidc_callback_view, oidc_sign_in_view
        from integrations.admin.shown_once import shown_once_view

        return [
            # Not behind admin_view either: the sign-in through the identity provider.
            path("oidc/sign-in/", oidc_sign_in_view, name="oidc_sign_in"),
            path("oidc/callback/", oidc_callback_view, name="oidc_callback"),
            # Not behind admin_view: they are how a staff member gets its permission.
            path("mfa/", mfa_verify_view, name="mfa_verify"),
            path("mfa/enrol/", mfa_enrol_view, name="mfa_enrol"),
            path("mfa/logout/", mfa_logout_view, name="mfa_logout"),
            path(
                "mfa/recovery-codes/",
                self.admin_view(mfa_recovery_codes_view),
                name="mfa_recovery_codes",
            ),
            path("guide/", self.admin_view(broker_guide_view), name="broker_guide"),
            path("metrics/", self.admin_view(drop_metrics_view), name="drop_metrics"),
            path("evidence/", self.admin_view(evidence_view), name="evidence"),
            # Ahead of the cycle admin's own URLs, which would take it for an object id.
            path(
                "integrations/dropcycle/<int:pk>/response-files.zip",
                self.admin_view(cycle_response_files_view),
                name="cycle_response_files",
            ),
            path(
                "shown-once/<str:token>/",
                self.admin_view(shown_once_view),
                name="shown_once",
            ),
            # Not unfold's command palette search (Ctrl/Cmd+K): it GETs what was typed, so
            # a clear email would land in the access logs (templates/unfold/helpers/command.html).
            *(url for url in super().get_urls() if getattr(url, "name", None) != "search"),
        ]

    def admin_view(self, view: Callable[..., Any], cacheable: bool = False) -> Callable[..., Any]:
        """Admin pages show their times in DROP's zone, each with its abbreviation (PST).

        Only the rendering is in that zone, but for the views of a ``ModelAdmin`` with a
        ``date_hierarchy``: its drill-down filters by the days its links name, so the whole
        view (and what is built from its list, as the ledger's export) reads days in DROP's
        calendar. What a page streams (an export) is written after it and stays UTC.
        """
        model_admin = getattr(view, "__self__", None)  # a ModelAdmin's views are its methods
        screened = _search_kept_out_of_urls(view)
        if isinstance(model_admin, ModelAdmin) and view.__name__ == "changelist_view":
            screened = _selection_of_ids_only(screened, model_admin)
        guarded = super().admin_view(_unstorable_input_refused(screened), cacheable)
        days_in_drop_zone = bool(getattr(model_admin, "date_hierarchy", None))

        @wraps(guarded)
        def in_drop_zone(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if days_in_drop_zone:
                with timezone.override(drop_timezone()):
                    response = guarded(request, *args, **kwargs)
            else:
                response = guarded(request, *args, **kwargs)
            if isinstance(response, TemplateResponse) and not response.is_rendered:
                with timezone.override(drop_timezone()):
                    response.render()
            return response

        return in_drop_zone

    # The admin's JavaScript catalog (Django's own strings, one language) is the same on
    # every page for every staff member, and every page loads it before it can run a
    # script: without this, each page view cost a second request to Django. Private,
    # behind the admin's login as before; a deployment's new catalog is read within an hour.
    @method_decorator(cache_control(private=True, max_age=3600))
    def i18n_javascript(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return super().i18n_javascript(request, extra_context)

    def register(
        self,
        model_or_iterable: type[_ModelT] | Iterable[type[_ModelT]],
        admin_class: type[ModelAdmin[_ModelT]] | None = None,
        **options: Any,
    ) -> None:
        """As Django's, and each ModelAdmin gets unfold's optional attributes it lacks, empty.

        Unfold's templates read them (``conditional_fields`` for every row of a form,
        ``list_sections`` for every row of a list), and a ModelAdmin without them (this
        version of unfold defines neither) costs each read a failed lookup: an exception and
        a dir() of the ModelAdmin, near half a millisecond a row. Empty, they mean what
        missing did: no conditional field, no section. Its list refuses text for an array
        column (``_ArrayComparedWithTextRefused``) and reads no encrypted column
        (``_EncryptedColumnsUnread``).
        """
        models = (
            [model_or_iterable]
            if isinstance(model_or_iterable, ModelBase)
            else list(model_or_iterable)
        )
        super().register(models, admin_class, **options)
        for model in models:
            model_admin = self._registry.get(model)  # a swapped model is not registered
            if model_admin is None:
                continue
            for name, empty in _UNFOLD_OPTIONAL_ATTRIBUTES.items():
                if not hasattr(model_admin, name):
                    setattr(model_admin, name, empty())
            model_admin.get_changelist = _lists_ruled(model_admin.get_changelist)  # type: ignore[method-assign]

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[Any]:
        """Every app and list the member may see, built when a page first reads it.

        Django puts it in every page's context (``available_apps``), asking each ModelAdmin
        for its permissions and reversing its URLs; yet our pages show it only where the
        sidebar has no entry (unfold's ``helpers/navigation.html``) and on the index.
        """
        if app_label is not None:
            return super().get_app_list(request, app_label)
        build = super().get_app_list
        # A list in all but its type: templates iterate, index, measure and test it.
        return cast(list[Any], SimpleLazyObject(lambda: build(request)))

    def has_permission(self, request: HttpRequest) -> bool:
        return super().has_permission(request) and self._second_factor_passed(request)

    @staticmethod
    def _second_factor_passed(request: HttpRequest) -> bool:
        # Imported when called: models load after this site is built.
        from integrations.admin.oidc import oidc_mfa_passed
        from integrations.services.staff.staff_mfa import staff_mfa_required

        cached = getattr(request, _SECOND_FACTOR_PASSED, None)
        if cached is None:
            user: Any = request.user
            verified = getattr(user, "is_verified", None)  # set by django-otp's middleware
            # The identity provider's own MFA (its ID token's amr) stands for ours.
            cached = (
                bool(verified and verified())
                or oidc_mfa_passed(request)
                or not staff_mfa_required(user)
            )
            setattr(request, _SECOND_FACTOR_PASSED, cached)
        return cached

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        from integrations.admin.oidc import oidc_enabled, oidc_sign_in_url
        from integrations.admin.sign_in import sign_in_record_when_complete
        from integrations.services.staff.staff_sign_in import PASSWORD

        oidc = {
            "oidc_enabled": oidc_enabled(),
            "oidc_only": settings.DROPPORTAL_OIDC_ONLY,
            "oidc_provider_name": settings.DROPPORTAL_OIDC_PROVIDER_NAME,
            "oidc_sign_in_url": oidc_sign_in_url(request.GET.get("next") or reverse("admin:index")),
        }
        if request.method == "POST" and settings.DROPPORTAL_OIDC_ONLY:
            # Refused here, not only hidden from the page: no password is even checked. Nor
            # recorded: anyone can post here, and unauthenticated traffic never grows the ledger.
            refused = {**oidc, "password_refused": True, **(extra_context or {})}
            page = super().login(_as_get(request), refused)
            page.status_code = 403
            return page
        before = request.user
        response = super().login(request, {**oidc, **(extra_context or {})})
        user = request.user
        # The form signed someone in (Django's login() puts them on the request), whoever was
        # signed in here before: every sign-in is recorded, one over another's session too,
        # once complete (after the second factor when one is asked).
        if request.method == "POST" and user is not before and user.is_authenticated:
            # The page's context read the second factor of whoever was signed in before.
            vars(request).pop(_SECOND_FACTOR_PASSED, None)
            sign_in_record_when_complete(request, method=PASSWORD)
        if (
            user.is_authenticated
            and user.is_active
            and user.is_staff
            and not self._second_factor_passed(request)
        ):
            wanted = request.POST.get("next") or request.GET.get("next") or reverse("admin:index")
            return HttpResponseRedirect(
                f"{reverse('admin:mfa_verify')}?{urlencode({'next': wanted})}"
            )
        return response

    def logout(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        """An OIDC session's sign-out goes on to the provider's end-session endpoint, so the
        person is signed out there too (RP-initiated logout)."""
        from integrations.admin.oidc import oidc_logout_url, oidc_session

        signed_in = oidc_session(request) if request.method == "POST" else None
        response = super().logout(request, extra_context)
        if signed_in and signed_in.get("id_token"):
            at_provider = oidc_logout_url(signed_in["id_token"])
            if at_provider:
                return HttpResponseRedirect(at_provider)
        return response

    def password_change(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponseBase:
        """A member's own password: the old one checked under the login's lockout, the
        change a ledger event (``integrations/admin/own_password.py``)."""
        from integrations.admin.own_password import own_password_change_view

        request.current_app = self.name
        return own_password_change_view(
            request,
            success_url=reverse(f"{self.name}:password_change_done", current_app=self.name),
            template_name=self.password_change_template,
            context={**self.each_context(request), **(extra_context or {})},
        )

    def index(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        # Imported when called: see the module docstring.
        from integrations.admin.dashboard import dashboard_context
        from integrations.services.staff.staff_mfa import staff_mfa_factors_once_in_clear

        # Staff with no role in the app see no figures of it, as Django shows them no list.
        shown = dashboard_context(request) if request.user.has_module_perms("integrations") else {}
        # Every member is told of their own factors that an older database dump holds in clear.
        member: Any = request.user  # a staff member: the index is behind admin_view
        shown["factors_once_in_clear"] = staff_mfa_factors_once_in_clear(member)
        return super().index(request, {**shown, **(extra_context or {})})


def _as_get(request: HttpRequest) -> HttpRequest:
    """The same request as a GET: the login page shown again, nothing it posted read."""
    shown = copy.copy(request)
    shown.method = "GET"
    shown.POST = QueryDict()  # type: ignore[assignment]
    return shown


def _unstorable_input_refused(view: Callable[..., Any]) -> Callable[..., Any]:
    """A page sent a character PostgreSQL cannot store (a NUL, ``%00``): a plain 400.

    No page of the admin needs one, and every page filters, searches or saves what it is sent:
    a NUL in a list filter, an autocomplete term or an export's filters would otherwise fail in
    the database (a ``DataError``). Checked here once, for every page behind ``admin_view``,
    Django's and the third-party admins' alike: the path (an object's id in it), the query
    string's names and values, and what is posted.
    """

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        sent = [request.path, dict(request.GET.lists())]
        if request.method == "POST":
            sent.append(dict(request.POST.lists()))
        problem = unstorable_reason(sent)
        if problem is not None:
            return HttpResponseBadRequest(
                f"Not read: {problem}, which no page takes.", content_type="text/plain"
            )
        return view(request, *args, **kwargs)

    return checked


# What PostgreSQL compares as the column's text (``scopes::text``): text is what they take.
_LOOKUPS_ON_TEXT = frozenset(
    ["iexact", "icontains", "startswith", "istartswith", "endswith", "iendswith", "regex", "iregex"]
)


class _ArrayComparedWithTextRefused(ChangeList):
    """A list filtered by text where an array column wants an array (``?scopes=x``,
    ``?scopes__contains=x``): PostgreSQL would fail the list ("malformed array literal"),
    and a query string holds nothing but text. A filter the list cannot apply, so the list
    without it (Django's ``?e=1``), whichever model and array column."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        listed = super().get_queryset(request, exclude_parameters)
        if any(_text_for_an_array(lookup) for lookup in _lookups(listed.query.where)):
            raise IncorrectLookupParameters("an array column is filtered by text")
        return listed


def _text_for_an_array(lookup: Lookup[Any]) -> bool:
    # A filter of code passes a list, made an ARRAY[...] expression; ``__in`` makes each
    # item a tuple, ``__isnull`` a truth. Text left as it came is what PostgreSQL would
    # read as an array literal.
    if not _array_valued(lookup.lhs) or lookup.lookup_name in _LOOKUPS_ON_TEXT:
        return False
    rhs = lookup.rhs
    return isinstance(rhs, str) or (
        isinstance(rhs, list | tuple) and any(isinstance(item, str) for item in rhs)
    )


def _array_valued(expression: Any) -> bool:
    if isinstance(getattr(expression, "output_field", None), ArrayField):
        return True
    # PostgreSQL takes an index after a slice as one more slice: scopes[1:2][1] is an array.
    while isinstance(expression, IndexTransform):
        expression = expression.lhs
        if isinstance(expression, SliceTransform):
            return True
    return False


def _lookups(where: WhereNode) -> Iterator[Lookup[Any]]:
    for child in where.children:
        if isinstance(child, WhereNode):
            yield from _lookups(child)
        elif isinstance(child, Lookup):
            yield child


class _EncryptedColumnsUnread(ChangeList):
    """A list reads no encrypted column (``EncryptedTextField``): neither of its rows nor of
    the rows it reads with them (``select_related``), nor of the rows its filters offer.

    No list shows one (a credential's page says whether it is set; a resolution's
    identifiers are shown nowhere): each read was a decryption for nothing, clear credentials
    and personal data in memory, and keys that cannot read them (a botched rotation) a 500
    on every list that reads a broker, when staff need the console to find out why. The
    queryset built here is also what an action gets: each action's service reads its row
    again, whole. A column that needs to know whether a secret is set reads it in SQL (the
    broker's "DROP API key").

    What it does not reach: a filter by a reverse relation reads its choices as Django does
    (whole rows), and a filter of its own (``SimpleListFilter``) reads its choices itself, so
    it reads them through ``encrypted_columns_unread`` (``CycleFilter``). A page that is not
    a list (a row's own, an action's) reads what it reads."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        # Imported when called: models load after this site is built.
        from integrations.models.fields import encrypted_columns_unread

        return encrypted_columns_unread(super().get_queryset(request, exclude_parameters))

    def get_filters(self, request: HttpRequest) -> Any:
        self.list_filter = [_choices_unread(self.model, entry) for entry in self.list_filter]
        return super().get_filters(request)


class _ChoicesWithoutEncryptedColumns(RelatedFieldListFilter):
    """A filter by a related row (``"broker"``) offers its choices read without their
    encrypted columns: a choice shows the row's name."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> Any:
        from integrations.models.fields import encrypted_columns_deferred

        # A reverse relation's choices are read otherwise (``ForeignObjectRel.get_choices``).
        if isinstance(field, ForeignObjectRel) or not encrypted_columns_deferred(
            field.related_model
        ):
            return super().field_choices(field, request, model_admin)
        return super().field_choices(cast(Any, _ChoicesUnread(field)), request, model_admin)


class _ChoicesUnread:
    """A relation's field as its filter reads it, but for its choices (Django's
    ``Field.get_choices``, the same rows), read with ``encrypted_columns_unread``."""

    def __init__(self, field: Any) -> None:
        self._field = field

    def __getattr__(self, name: str) -> Any:
        return getattr(self._field, name)

    def get_choices(
        self,
        include_blank: bool = True,
        blank_choice: Any = BLANK_CHOICE_DASH,
        limit_choices_to: Any = None,
        ordering: Any = (),
    ) -> list[Any]:
        from integrations.models.fields import encrypted_columns_unread

        field = self._field
        model = field.remote_field.model
        offered = model._default_manager.complex_filter(
            limit_choices_to or field.get_limit_choices_to()
        )
        if ordering:
            offered = offered.order_by(*ordering)
        value = operator.attrgetter(field.remote_field.get_related_field().attname)
        choices = [(value(row), str(row)) for row in encrypted_columns_unread(offered)]
        return [*blank_choice, *choices] if include_blank else choices


_CHOICES_UNREAD: dict[type[Any], type[Any]] = {}  # one class per filter class


def _choices_unread(model: type[Model], entry: Any) -> Any:
    """A list's ``list_filter`` entry, its related rows' choices read without their
    encrypted columns: a field named alone gets the filter Django would give it."""
    if isinstance(entry, (list, tuple)):
        path, filter_class = entry
    elif isinstance(entry, str):
        path, filter_class = entry, _filter_class(model, entry)
    else:
        return entry  # a filter of its own (``SimpleListFilter``)
    if not (isinstance(filter_class, type) and issubclass(filter_class, RelatedFieldListFilter)):
        return entry
    if issubclass(filter_class, _ChoicesWithoutEncryptedColumns):
        return entry  # a list's filters are read more than once
    if filter_class not in _CHOICES_UNREAD:
        _CHOICES_UNREAD[filter_class] = type(
            filter_class.__name__, (_ChoicesWithoutEncryptedColumns, filter_class), {}
        )
    return (path, _CHOICES_UNREAD[filter_class])


def _filter_class(model: type[Model], path: str) -> Any:
    try:
        field = get_fields_from_path(model, path)[-1]
    except (FieldDoesNotExist, NotRelationField):
        return None  # Django's own error, when it builds the filter
    # As ``FieldListFilter.create`` chooses.
    for test, filter_class in FieldListFilter._field_list_filters:  # type: ignore[attr-defined]
        if test(field):
            return filter_class
    return None


_RULED: dict[type[ChangeList], type[ChangeList]] = {}  # one class per list class


def _ruled_changelist(changelist: type[ChangeList]) -> type[ChangeList]:
    if changelist not in _RULED:
        _RULED[changelist] = type(
            changelist.__name__,
            (_ArrayComparedWithTextRefused, _EncryptedColumnsUnread, changelist),
            {},
        )
    return _RULED[changelist]


def _lists_ruled(get_changelist: Callable[..., type[ChangeList]]) -> Callable[..., Any]:
    """A ModelAdmin's ``get_changelist``, its list class screening array filters and
    reading no encrypted column: every list, the third-party admins' and those on unfold's
    or our own list classes alike."""

    @wraps(get_changelist)
    def ruled(request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _ruled_changelist(get_changelist(request, **kwargs))

    return ruled


def _selection_of_ids_only(view: Callable[..., Any], model_admin: ModelAdmin) -> Callable[..., Any]:
    """An action on a list's selection: each selected row must be an id of the list's model.

    Django filters the rows by what was posted and fails (a ``ValueError``, a 500) on one that
    is not an id, such as ``abc``; no checkbox of a list sends one. Checked here once for every
    list with actions, Django's, axes' and Procrastinate's included, and the delete
    confirmation (which posts to the list too): a plain 400, nothing done.
    """
    pk = model_admin.model._meta.pk
    assert pk is not None  # every model has one once its app is ready
    plural = model_admin.model._meta.verbose_name_plural

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method == "POST":
            for selected in request.POST.getlist(ACTION_CHECKBOX_NAME):
                try:
                    pk.to_python(selected)
                except ValidationError:
                    return HttpResponseBadRequest(
                        f"Not done: the selection holds a value that is no id of the {plural}.",
                        content_type="text/plain",
                    )
        return view(request, *args, **kwargs)

    return checked


AUTOCOMPLETE_VAR = "term"  # django.contrib.admin.views.autocomplete's search parameter
# The lists searched by names of ours (brokers, SaaS connections, keys, providers, files,
# staff's names, sign-in names and addresses), none a consumer's: their terms travel as typed
# (a clear email or phone still as its hash, ``search_terms.named_search_token``). The lists
# of integrations, every kind's, say so themselves (``IntegrationAdmin.search_term_for_url``).
_LISTS_SEARCHED_BY_OUR_NAMES = frozenset(
    {
        "integrations.Broker",
        "integrations.DropCycle",
        "integrations.ReportFile",
        "integrations.SaasConnection",
        "integrations.ApiKey",
        "integrations.ServiceProvider",
        "integrations.Directive",
        "auth.User",
        "auth.Group",
        "axes.AccessAttempt",
        "axes.AccessLog",
        "axes.AccessFailureLog",
    }
)


def _search_kept_out_of_urls(view: Callable[..., Any]) -> Callable[..., Any]:
    """A list's search: posted terms come back in the URL as they may travel, or not at all.

    The list's ModelAdmin may say how its terms travel (``search_term_for_url``: the term,
    its hash, or None to refuse it); a list searched by names of ours lets any term travel
    (``_LISTS_SEARCHED_BY_OUR_NAMES``); by default only an id of ours travels, and a clear
    email or phone as its hash (``search_terms.search_token``): a name, a date of birth, a
    ZIP code or a VIN never reaches the access log.
    """
    # Imported when called: see the module docstring.
    from integrations.selectors.search_terms import named_search_token, search_token

    model_admin = getattr(view, "__self__", None)
    model = getattr(model_admin, "model", None)
    named = model is not None and model._meta.label in _LISTS_SEARCHED_BY_OUR_NAMES
    for_url: Callable[[str], str | None] = getattr(
        model_admin, "search_term_for_url", named_search_token if named else search_token
    )

    @wraps(view)
    @sensitive_post_parameters(SEARCH_VAR)  # an error report shows no term typed
    def searched(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method == "POST" and "_search" in request.POST:
            return _search_redirect(request, for_url(request.POST.get(SEARCH_VAR, "")))
        typed = request.GET.get(SEARCH_VAR)
        if typed is not None and for_url(typed) != typed.strip():
            return _search_redirect(request, None)  # never searched, never echoed back
        # Django's autocomplete, behind the same admin_view, reads its search as ``term``
        # and answers a widget in JSON: a clear email or phone there is refused plainly.
        asked = request.GET.get(AUTOCOMPLETE_VAR)
        if asked is not None and search_token(asked) != asked.strip():
            return HttpResponseBadRequest(
                "Not searched: only an id travels in an address, never an email address,"
                " a phone number, a name or a date.",
                content_type="text/plain",
            )
        return view(request, *args, **kwargs)

    return searched


def _search_redirect(request: HttpRequest, term: str | None) -> HttpResponseRedirect:
    params = request.GET.copy()
    params.pop(SEARCH_VAR, None)
    params.pop(PAGE_VAR, None)  # a new search starts on its first page
    if term is None:
        messages.error(
            request,
            "Not searched: type it in the search box. An email address or phone number is "
            "hashed before it reaches an address; words that are not an id of this list (a "
            "name, a date, a ZIP code, a VIN) are not sent.",
        )
    elif term:
        params[SEARCH_VAR] = term
    query = params.urlencode()
    return HttpResponseRedirect(f"{request.path}?{query}" if query else request.path)
