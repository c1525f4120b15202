package seclake.sandbox;

import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.stream.Collectors;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.analysis.UnresolvedFunction;
import org.apache.spark.sql.catalyst.analysis.UnresolvedRelation;
import org.apache.spark.sql.catalyst.analysis.UnresolvedTable;
import org.apache.spark.sql.catalyst.analysis.UnresolvedTableOrView;
import org.apache.spark.sql.catalyst.analysis.UnresolvedTableValuedFunction;
import org.apache.spark.sql.catalyst.analysis.UnresolvedView;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression;
import org.apache.spark.sql.catalyst.parser.ParameterContext;
import org.apache.spark.sql.catalyst.parser.ParseException;
import org.apache.spark.sql.catalyst.parser.ParserInterface;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.ParsedStatement;
import org.apache.spark.sql.execution.command.ExplainCommand;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;
import scala.runtime.BoxedUnit;

/**
 * seclake's SQL sandbox inside the JVM, for `seclake serve`: statements from JDBC/ODBC clients
 * never pass through Python, so the policy of pipelines/sandbox.py is enforced here, on the plan
 * Spark's parser (with Delta's) returns, before analysis runs anything.
 *
 * <p>Allowed: queries over catalog tables (SELECT, WITH, VALUES, time travel), DESCRIBE / SHOW
 * statements, USE, and EXPLAIN of an allowed statement. Refused: every other command (writes, DDL,
 * SET, ADD JAR, CACHE, Delta's RESTORE/VACUUM/OPTIMIZE, SQL scripts), TRANSFORM ... USING, the
 * functions listed in spark.seclake.sandbox.escapeFunctions (pipelines/sandbox.py's list: reflect,
 * java_method, ...) anywhere in a statement, IDENTIFIER(...) clauses, and table names that are not
 * plain catalog tables (parquet.`/etc`, delta.`/path`, `/tmp/x`).
 *
 * <p>Checking the parsed plan, not the analysed one, keeps Spark's and Delta's own internal reads
 * (Delta reads its log as JSON/Parquet files) out of the policy: they never go through the parser.
 * The session that `seclake serve` itself uses to register the tables is exempted by {@link #trust};
 * every JDBC connection gets a new session, which is not.
 */
public final class SqlSandbox extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {

  /** Spark setting (static, clients cannot change it) naming the escape functions, comma-separated. */
  public static final String FUNCTIONS_CONF = "spark.seclake.sandbox.escapeFunctions";

  private static final Set<SparkSession> TRUSTED = Collections.synchronizedSet(
      Collections.newSetFromMap(new WeakHashMap<>()));

  /** Root statements that only describe the catalog (by Spark's and Delta's naming: Describe*, Show*) or switch to it. */
  private static final Set<String> CATALOG_READS = Set.of("SetCatalogAndNamespace");

  /** Plan nodes of plain queries live in these packages; a plan node from anywhere else (Delta's commands,
   * Spark's execution commands) is a statement the sandbox does not know to be read-only. */
  private static final Set<String> QUERY_PACKAGES = Set.of(
      "org.apache.spark.sql.catalyst.plans.logical", "org.apache.spark.sql.catalyst.analysis");

  private static final List<String> TABLE_NAMESPACE = List.of("default");

  /** Exempt `session` (seclake serve's own, which registers the tables) from the sandbox. */
  public static void trust(SparkSession session) {
    TRUSTED.add(session);
  }

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectParser(new AbstractFunction2<SparkSession, ParserInterface, ParserInterface>() {
      @Override
      public ParserInterface apply(SparkSession session, ParserInterface delegate) {
        String listed = session.sparkContext().getConf().get(FUNCTIONS_CONF, "");
        Set<String> functions = Arrays.stream(listed.split(","))
            .map(f -> f.trim().toLowerCase(Locale.ROOT)).filter(f -> !f.isEmpty()).collect(Collectors.toSet());
        if (functions.isEmpty()) {
          throw new IllegalStateException(FUNCTIONS_CONF + " is not set: start the endpoint with `seclake serve`");
        }
        return new Guard(session, delegate, functions);
      }
    });
    return BoxedUnit.UNIT;
  }

  /** A statement the sandbox refuses; the message is what the JDBC client shows. */
  public static final class Refused extends SecurityException {
    private static final long serialVersionUID = 1L;

    Refused(String reason) {
      super("seclake sandbox: " + reason);
    }
  }

  static final class Guard implements ParserInterface {
    private final SparkSession session;
    private final ParserInterface delegate;
    private final Set<String> functions;

    Guard(SparkSession session, ParserInterface delegate, Set<String> functions) {
      this.session = session;
      this.delegate = delegate;
      this.functions = functions;
    }

    @Override
    public LogicalPlan parsePlan(String sqlText) throws ParseException {
      return checked(delegate.parsePlan(sqlText));
    }

    @Override
    public LogicalPlan parsePlanWithParameters(String sqlText, ParameterContext context) throws ParseException {
      return checked(delegate.parsePlanWithParameters(sqlText, context));
    }

    @Override
    public LogicalPlan parseQuery(String sqlText) throws ParseException {
      return checked(delegate.parseQuery(sqlText));
    }

    // Expressions, names and types: no statement to run (an expression is checked inside its plan).
    @Override
    public Expression parseExpression(String sqlText) throws ParseException {
      return delegate.parseExpression(sqlText);
    }

    @Override
    public TableIdentifier parseTableIdentifier(String sqlText) throws ParseException {
      return delegate.parseTableIdentifier(sqlText);
    }

    @Override
    public FunctionIdentifier parseFunctionIdentifier(String sqlText) throws ParseException {
      return delegate.parseFunctionIdentifier(sqlText);
    }

    @Override
    public Seq<String> parseMultipartIdentifier(String sqlText) throws ParseException {
      return delegate.parseMultipartIdentifier(sqlText);
    }

    @Override
    public StructType parseRoutineParam(String sqlText) throws ParseException {
      return delegate.parseRoutineParam(sqlText);
    }

    @Override
    public StructType parseTableSchema(String sqlText) throws ParseException {
      return delegate.parseTableSchema(sqlText);
    }

    @Override
    public DataType parseDataType(String sqlText) throws ParseException {
      return delegate.parseDataType(sqlText);
    }

    private LogicalPlan checked(LogicalPlan plan) {
      if (!TRUSTED.contains(session)) {
        statement(plan);
      }
      return plan;
    }

    private void statement(LogicalPlan plan) {
      if (plan instanceof ExplainCommand) {  // EXPLAIN runs nothing, but its statement must be allowed too
        statement(((ExplainCommand) plan).logicalPlan());
        return;
      }
      String name = plan.getClass().getSimpleName();
      boolean catalogRead = name.startsWith("Describe") || name.startsWith("Show") || CATALOG_READS.contains(name);
      node(plan, catalogRead);
    }

    private void node(LogicalPlan plan, boolean allowCommand) {
      Class<?> type = plan.getClass();
      String name = type.getSimpleName();
      boolean command = plan instanceof Command || plan instanceof ParsedStatement || name.endsWith("Command")
          || name.endsWith("Statement") || name.startsWith("Compound") || !QUERY_PACKAGES.contains(type.getPackageName());
      if (name.contains("ScriptTransformation")) {
        throw new Refused("TRANSFORM ... USING runs an external command: not allowed");
      }
      if (name.contains("UnresolvedIdentifier") || name.contains("ExecuteImmediate")) {
        throw new Refused("IDENTIFIER(...) and EXECUTE IMMEDIATE build statements or names at run time, "
            + "which the sandbox cannot check: not allowed");
      }
      if (name.startsWith("UnresolvedPathBased")) {  // DESCRIBE HISTORY '/path' and the like: a read, but by path
        throw new Refused("table " + pathOf(plan) + " is not allowed: read seclake tables by name (no file paths)");
      }
      if (command && !allowCommand) {
        throw new Refused(name + " is not allowed: this endpoint only reads (queries, DESCRIBE, SHOW, USE, EXPLAIN)");
      }
      // Every way a statement names a table: FROM/JOIN, and the targets of DESCRIBE and SHOW.
      if (plan instanceof UnresolvedRelation) {
        table(((UnresolvedRelation) plan).multipartIdentifier());
      } else if (plan instanceof UnresolvedTableOrView) {
        table(((UnresolvedTableOrView) plan).multipartIdentifier());
      } else if (plan instanceof UnresolvedTable) {
        table(((UnresolvedTable) plan).multipartIdentifier());
      } else if (plan instanceof UnresolvedView) {
        table(((UnresolvedView) plan).multipartIdentifier());
      }
      if (plan instanceof UnresolvedTableValuedFunction) {
        function(((UnresolvedTableValuedFunction) plan).name());
      }
      for (Expression e : list(plan.expressions())) {
        expression(e);
      }
      for (LogicalPlan child : list(plan.children())) {
        node(child, false);
      }
      for (Object inner : list(plan.innerChildren())) {  // CTE definitions of WITH, among others
        if (inner instanceof LogicalPlan) {
          node((LogicalPlan) inner, false);
        }
      }
    }

    private static String pathOf(LogicalPlan plan) {
      try {
        return "'" + plan.getClass().getMethod("path").invoke(plan) + "'";
      } catch (ReflectiveOperationException e) {
        return "by path";
      }
    }

    private void expression(Expression e) {
      if (e instanceof UnresolvedFunction) {
        function(((UnresolvedFunction) e).nameParts());
      }
      if (e.getClass().getSimpleName().contains("UnresolvedIdentifier")) {
        throw new Refused("IDENTIFIER(...) builds names at run time, which the sandbox cannot check: not allowed");
      }
      if (e instanceof SubqueryExpression) {
        node(((SubqueryExpression) e).plan(), false);
      }
      for (Expression child : list(e.children())) {  // lambda bodies included
        expression(child);
      }
    }

    private void function(Seq<String> nameParts) {
      List<String> parts = list(nameParts);
      String name = parts.get(parts.size() - 1).toLowerCase(Locale.ROOT);
      if (functions.contains(name)) {
        throw new Refused("function " + name + "() is not allowed: it escapes SQL (Java reflection or files)");
      }
    }

    private void table(Seq<String> identifier) {
      List<String> parts = list(identifier);
      String shown = String.join(".", parts);
      String name = parts.get(parts.size() - 1);
      List<String> namespace = parts.subList(0, parts.size() - 1);
      boolean plain = namespace.isEmpty() || namespace.equals(TABLE_NAMESPACE)
          || namespace.equals(List.of("spark_catalog", "default"));
      if (!plain || name.contains("/") || name.contains(":")) {
        throw new Refused("table " + shown + " is not allowed: read seclake tables by name (no file paths)");
      }
    }

    private static <T> List<T> list(scala.collection.Seq<T> seq) {
      return CollectionConverters.asJava(seq);
    }
  }
}
